//! Support for unit tests of both sides' indexes and routes without an API server.

/// A Kubernetes client whose every request fails at once ("there is no API server"), with
/// `namespace` as its default: routing, resync and watch indexes can then be driven by
/// synthetic events alone. Needs a tokio runtime (the client spawns its buffer task).
#[must_use]
pub fn offline_client(namespace: &str) -> kube::Client {
    let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
        Err::<http::Response<kube::client::Body>, _>(std::io::Error::other("unit test: there is no API server"))
    });
    kube::Client::new(service, namespace)
}
