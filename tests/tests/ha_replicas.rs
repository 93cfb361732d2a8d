//! Principal replicas sharing the agents of one hub (`--agent-leases`, `principal/src/lease.rs`),
//! as real processes behind an L4 load balancer standing in for the Kubernetes Service
//! ([`tests::replicas`]): an owner killed mid-sync hands its agents over (behind Envoy sidecars
//! and with native mTLS), a replica cut off from the hub API stops writing for its agents before
//! another takes them, and a replica shut down hands its agents over at once.

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};
use tests::apps::{apps, path_is, wait_object};
use tests::faultproxy::FaultProxy;
use tests::fixtures::app_with_path;
use tests::replicas::{
    Churn, Field, HubAccess, Replicas, TEST_CONVERGE as CONVERGE, TEST_LEASE as LEASE, Target, attach_to,
    bootstrap_args, log_time, owner, replica_lease_exists, replicas_on, wait_owner,
};
use tests::topology::{ARGOCD_NS, Clusters, MeshOptions, Mode, StartOptions, Topology, Transport};
use tests::wait_until_async;
use tokio::time::Instant;

/// The agents' first reconnect delay is 1 s scaled by a jitter factor in [0.75, 1.25)
/// (`agent/src/backoff.rs` defaults; the agent has no flag for them).
const MIN_BACKOFF: Duration = Duration::from_millis(750);

/// `count` Applications per agent, created on their owner side and seen on the other, and the
/// targets a [`Churn`] changes: managed specs on the hub and statuses on the spoke; autonomous
/// specs and statuses on the spoke.
async fn workload(t: &Topology, r: &Replicas, agents: &[(&str, Mode)], count: usize) -> Result<Vec<Target>> {
    let mut targets = Vec::new();
    for (agent, mode) in agents {
        let hub = apps(&t.hub(), agent);
        let spoke = apps(&t.spoke(agent)?, ARGOCD_NS);
        for i in 0..count {
            let name = format!("{agent}-app-{i}");
            let (owner_side, other, ns) = match mode {
                Mode::Managed => (&hub, &spoke, *agent),
                Mode::Autonomous => (&spoke, &hub, ARGOCD_NS),
            };
            owner_side.create(&PostParams::default(), &app_with_path(&name, ns, "v0")?).await?;
            let what = format!("{name} to reach the other side");
            wait_object(other, &name, CONVERGE, &what, path_is("v0"), || format!("{}\n{}", r.logs(), t.logs())).await?;
            let target = |label: &str, write: &Api<DynamicObject>, read: &Api<DynamicObject>, field| Target {
                label: format!("{agent}/{name} {label}"),
                write: write.clone(),
                read: read.clone(),
                name: name.clone(),
                field,
            };
            match mode {
                Mode::Managed => {
                    targets.push(target("spec (hub -> spoke)", &hub, &spoke, Field::Path));
                    targets.push(target("status (spoke -> hub)", &spoke, &hub, Field::Revision));
                }
                Mode::Autonomous => {
                    targets.push(target("spec (spoke -> hub)", &spoke, &hub, Field::Path));
                    targets.push(target("status (spoke -> hub)", &spoke, &hub, Field::Revision));
                }
            }
        }
    }
    Ok(targets)
}

/// Sum of a metric over every running replica.
async fn metric_sum(r: &Replicas, name: &str, labels: &str) -> f64 {
    let mut sum = 0.0;
    for replica in r.all() {
        sum += replica.metric(name, labels).await.unwrap_or(0.0);
    }
    sum
}

/// Kill the replica that owns both agents while changes cross both ways (its pod: the principal,
/// then its Envoy sidecar on a mesh, both SIGKILLed; the load balancer is not told and skips the
/// dead backend when its dial is refused); both agents re-attach to other replicas (their Leases
/// change holder, `leaseTransitions` grows) and every change arrives.
async fn owner_killed_mid_sync(transport: Transport) -> Result<()> {
    let agents = [("m1", Mode::Managed), ("a1", Mode::Autonomous)];
    let (mut t, mut r) = replicas_on(&agents, transport, StartOptions::default(), &["r0", "r1", "r2"]).await?;
    attach_to(&mut t, &r, &["m1", "a1"], 1).await?;
    let targets = workload(&t, &r, &agents, 3).await?;
    let mut churn = Churn::start(targets, Duration::from_millis(40));
    wait_until_async(CONVERGE, "changes to be flowing", || async { churn.count() >= 24 }).await?;

    // Whoever holds the Leases now (the steering put both agents on one replica).
    let mut before = Vec::new();
    for (agent, _) in &agents {
        before.push(owner(&t.hub(), agent).await?.with_context(|| format!("no Lease of {agent}"))?);
    }
    let victim = before[0].0.clone();
    ensure!(before.iter().all(|(h, _)| *h == victim), "the agents are not on one replica: {before:?}");
    let victim_index = r.index_of(&victim)?;
    let killed = Instant::now();
    r.replica_mut(victim_index).kill()?;

    let mut reattach = Vec::new();
    for ((agent, _), (_, transitions)) in agents.iter().zip(&before) {
        let what = format!("agent {agent}'s Lease to move off the killed replica {victim}");
        let moved = wait_owner(&t.hub(), agent, CONVERGE, &what, |h, n| h != victim && n > *transitions).await;
        let (holder, n) = moved.with_context(|| format!("{}\n{}", r.logs(), t.logs()))?;
        let leased = killed.elapsed();
        let new = r.index_of(&holder)?;
        let what = format!("agent {agent} to be served by {holder}");
        let served = wait_until_async(CONVERGE, &what, || async { r.replica(new).connects(agent) >= 1 }).await;
        served.with_context(|| format!("{}\n{}", r.logs(), t.logs()))?;
        reattach.push(format!(
            "{agent}: Lease {victim} -> {holder} (transitions {transitions} -> {n}) after {leased:?}, stream served after {:?}",
            killed.elapsed()
        ));
    }
    // Keep changing a while on the new owners, then everything must have crossed.
    let done = churn.count();
    wait_until_async(CONVERGE, "changes to keep flowing after the handover", || async { churn.count() >= done + 24 })
        .await?;
    churn.stop().await?;
    let took = churn.converged(CONVERGE, || format!("{}\n{}", r.logs(), t.logs())).await?;
    let takeovers = metric_sum(&r, "argocd_principal_agent_lease_takeovers_total", "from=\"live\"").await
        + metric_sum(&r, "argocd_principal_agent_lease_takeovers_total", "from=\"expired\"").await;
    ensure!(takeovers >= 2.0, "takeovers counted by the surviving replicas: {takeovers}\n{}", r.logs());
    eprintln!(
        "[{transport:?}] killed {victim} after {done} writes; {}; {} writes in all, converged {took:?} after the last; \
         load balancer: {} refused dials, picks {:?}",
        reattach.join("; "),
        churn.count(),
        r.lb.refused(),
        r.lb.picks()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_killed_mid_sync_hands_its_agents_over_behind_envoy() -> Result<()> {
    owner_killed_mid_sync(Transport::Mesh).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_killed_mid_sync_hands_its_agents_over_with_native_mtls() -> Result<()> {
    owner_killed_mid_sync(Transport::Mtls).await
}

/// SIGTERM: the replica closes its streams with `x-argocd-agent-reconnect: immediately`, the
/// agents reconnect without backoff to the other replica (the terminating one is out of the
/// load balancer, as a terminating pod leaves the Service's endpoints), and its own Lease is
/// deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_shut_down_hands_its_agents_over_at_once() -> Result<()> {
    shut_down_hands_over(Transport::Mtls).await
}

/// The same behind Envoy sidecars, the terminating replica's sidecar outliving its principal (as
/// Istio's drain or a `preStop` hook keeps it; a plain Envoy given SIGTERM with the principal
/// exits at once and resets the stream before the trailer arrives, so the agent backs off).
///
/// Fails as of this writing: the trailer arrives, but the agent's immediate Subscribe goes
/// through its own sidecar's pooled HTTP/2 connection, which the load balancer pinned to the
/// terminating replica's sidecar; that sidecar answers 503 (`upstream connect error`), a refusal,
/// and the agent backs off. docs/ha.md says nothing changes behind sidecars.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_shut_down_behind_envoy_hands_its_agents_over_at_once() -> Result<()> {
    shut_down_hands_over(Transport::Mesh).await
}

async fn shut_down_hands_over(transport: Transport) -> Result<()> {
    let agents = [("m1", Mode::Managed), ("a1", Mode::Autonomous)];
    let (mut t, mut r) = replicas_on(&agents, transport, StartOptions::default(), &["r0", "r1"]).await?;
    attach_to(&mut t, &r, &["m1", "a1"], 0).await?;
    let targets = workload(&t, &r, &agents, 2).await?;
    let mut churn = Churn::start(targets, Duration::from_millis(50));
    wait_until_async(CONVERGE, "changes to be flowing", || async { churn.count() >= 16 }).await?;
    let backoffs_before: Vec<usize> =
        agents.iter().map(|(a, _)| t.agent_log_lines(a, "reconnecting after backoff").len()).collect();
    let transitions: Vec<i32> = {
        let mut v = Vec::new();
        for (a, _) in &agents {
            v.push(owner(&t.hub(), a).await?.context("no Lease")?.1);
        }
        v
    };

    // A terminating pod leaves the Service's endpoints; its sidecar (if any) stays until the
    // principal has exited.
    r.lb.set_down(0, true);
    let term = Instant::now();
    r.replica_mut(0).terminate_pod(Duration::from_secs(30), true).await.with_context(|| t.logs())?;
    let exited = term.elapsed();
    ensure!(!replica_lease_exists(&t.hub(), "r0").await?, "r0's replica Lease is still there after its exit");

    let mut lines = Vec::new();
    for (((agent, _), before), n) in agents.iter().zip(&backoffs_before).zip(&transitions) {
        let what = format!("agent {agent} to be owned by r1");
        wait_owner(&t.hub(), agent, CONVERGE, &what, |h, m| h == "r1" && m > *n)
            .await
            .with_context(|| format!("{}\n{}", r.logs(), t.logs()))?;
        let what = format!("agent {agent} to be served by r1");
        let served = wait_until_async(CONVERGE, &what, || async { r.replica(1).connects(agent) >= 1 }).await;
        served.with_context(|| format!("{}\n{}", r.logs(), t.logs()))?;
        // From the agent seeing its stream end to r1 accepting the new one, on the logs' clock.
        let failed = t.agent_log_lines(agent, "event stream failed");
        let failed = failed.last().with_context(|| format!("agent {agent} logged no stream end"))?;
        ensure!(failed.contains("reconnect_at_once=true"), "agent {agent} was not told to reconnect at once: {failed}");
        let connected = r.replica(1).log_lines(&format!("agent connected agent={agent} "));
        let (Some(ended), Some(attached)) = (log_time(failed), connected.first().and_then(|l| log_time(l))) else {
            bail!("no timestamps in {failed:?} / {connected:?}");
        };
        let delay = (attached - ended).to_std().unwrap_or_default();
        let backoffs = t.agent_log_lines(agent, "reconnecting after backoff").len();
        ensure!(
            backoffs == *before,
            "agent {agent} backed off before reconnecting ({before} -> {backoffs} backoff lines); its refused \
             attempts: {:?}\n{}",
            t.agent_log_lines(agent, "cannot connect to the principal"),
            t.logs()
        );
        ensure!(
            delay < MIN_BACKOFF,
            "agent {agent} took {delay:?} to reach r1, not under the shortest backoff {MIN_BACKOFF:?}"
        );
        lines.push(format!("{agent}: stream end -> served by r1 in {delay:?}"));
    }
    let done = churn.count();
    wait_until_async(CONVERGE, "changes to keep flowing on r1", || async { churn.count() >= done + 16 }).await?;
    churn.stop().await?;
    churn.converged(CONVERGE, || format!("{}\n{}", r.logs(), t.logs())).await?;
    let expired = r.replica(1).metric("argocd_principal_agent_lease_takeovers_total", "from=\"expired\"").await;
    let live = r.replica(1).metric("argocd_principal_agent_lease_takeovers_total", "from=\"live\"").await;
    eprintln!(
        "[{transport:?}] SIGTERM r0: exited after {exited:?}; {}; agents' backoff would be >= {MIN_BACKOFF:?}; r1 takeovers: \
         expired {expired:?}, live {live:?}",
        lines.join("; ")
    );
    Ok(())
}

// === The partitioned replica ===

/// Applications of the partitioned replica's agent (one status event of each can be in flight).
const APPS: usize = 3;

/// What the hub's audit log records: writes of Applications with their bodies, writes of Leases.
const AUDIT_POLICY: &str = r"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    verbs: [create, update, patch, delete]
    resources:
      - group: argoproj.io
        resources: [applications]
  - level: Metadata
    verbs: [create, update, patch, delete]
    resources:
      - group: coordination.k8s.io
        resources: [leases]
  - level: None
";

/// One audit event, as far as the test reads it.
#[derive(Debug, Clone)]
struct Audited {
    user: String,
    verb: String,
    resource: String,
    name: String,
    code: i64,
    received: chrono::DateTime<chrono::Utc>,
    body: Value,
}

fn read_audit(path: &std::path::Path) -> Result<Vec<Audited>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("audit log {}", path.display()))?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let e: Value = serde_json::from_str(line)?;
        if e["stage"] != "ResponseComplete" {
            continue;
        }
        let received = e["requestReceivedTimestamp"].as_str().context("no requestReceivedTimestamp")?;
        out.push(Audited {
            user: e["user"]["username"].as_str().unwrap_or_default().to_owned(),
            verb: e["verb"].as_str().unwrap_or_default().to_owned(),
            resource: e["objectRef"]["resource"].as_str().unwrap_or_default().to_owned(),
            name: e["objectRef"]["name"].as_str().unwrap_or_default().to_owned(),
            code: e["responseStatus"]["code"].as_i64().unwrap_or(0),
            received: chrono::DateTime::parse_from_rfc3339(received)?.with_timezone(&chrono::Utc),
            body: e["requestObject"].clone(),
        });
    }
    Ok(out)
}

/// A ServiceAccount for `replica` bound to the principal's roles (`install/rbac/principal.yaml`),
/// and a token for it: each replica is its own user in the audit log.
async fn replica_identity(hub: &kube::Client, replica: &str) -> Result<(String, String)> {
    let sa = format!("argocd-agent-principal-{replica}");
    let post = |path: String, body: Value| {
        let req = serde_json::to_vec(&body)
            .map_err(anyhow::Error::from)
            .and_then(|b| Ok(http::Request::post(path).header("content-type", "application/json").body(b)?));
        async move {
            let req = req?;
            let answer: Value = hub.request(req).await?;
            anyhow::Ok(answer)
        }
    };
    let subject = json!([{"kind": "ServiceAccount", "name": sa, "namespace": ARGOCD_NS}]);
    post(
        format!("/api/v1/namespaces/{ARGOCD_NS}/serviceaccounts"),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}),
    )
    .await?;
    post(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".to_owned(),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": sa},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "argocd-agent-principal"},
            "subjects": subject}),
    )
    .await?;
    post(
        format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ARGOCD_NS}/rolebindings"),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": sa},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "argocd-agent-principal"},
            "subjects": subject}),
    )
    .await?;
    let token = post(
        format!("/api/v1/namespaces/{ARGOCD_NS}/serviceaccounts/{sa}/token"),
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}}),
    )
    .await?;
    let token = token["status"]["token"].as_str().context("TokenRequest without a token")?.to_owned();
    Ok((format!("system:serviceaccount:{ARGOCD_NS}:{sa}"), token))
}

/// Replica `rp` reaches the hub's real kube-apiserver through a fault proxy; it owns a managed
/// agent whose spoke keeps changing its status. The proxy black-holes: `rp` stops writing and
/// closes the agent's stream within the Lease duration, `rq` takes the agent and its status
/// writes continue there. After the partition heals, the hub's audit log (each replica is its
/// own ServiceAccount) shows what `rp` wrote: nothing whose value reached the spoke after `rp`
/// gave the agent up, and what was on the wire when the partition began is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_replica_never_writes_after_losing_ownership() -> Result<()> {
    let audit_dir = tempfile::Builder::new().prefix("ha-audit-").tempdir()?;
    let (policy, log) = (audit_dir.path().join("policy.yaml"), audit_dir.path().join("audit.log"));
    std::fs::write(&policy, AUDIT_POLICY)?;
    let options = StartOptions {
        clusters: Clusters::REAL_HUB,
        start_agents: false,
        principal_args: bootstrap_args(),
        hub_apiserver_args: vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", log.display()),
            "--audit-log-format=json".to_owned(),
        ],
        ..StartOptions::default()
    };
    let agents = [("m1", Mode::Managed)];
    let mut t = Topology::start_with_transport(&agents, Transport::Mtls, MeshOptions::default(), options).await?;
    t.stop_principal(Duration::from_secs(30))?;
    t.set_principal_args(&[]);
    let (p_user, p_token) = replica_identity(&t.hub(), "rp").await?;
    let (q_user, q_token) = replica_identity(&t.hub(), "rq").await?;
    let hub_url = tests::replicas::hub_server(&t.process_kubeconfig())?;
    let hub_addr: std::net::SocketAddr = hub_url.trim_start_matches("https://").parse()?;
    let proxy = FaultProxy::start(hub_addr).await?;
    let access = [
        ("rp", HubAccess { server: Some(format!("https://{}", proxy.addr())), token: Some(p_token) }),
        ("rq", HubAccess { server: None, token: Some(q_token) }),
    ];
    let r = Replicas::start(&t, &access, LEASE).await?;
    attach_to(&mut t, &r, &["m1"], 0).await?;
    let (_, transitions) = owner(&t.hub(), "m1").await?.context("no Lease of m1")?;

    let hub = apps(&t.hub(), "m1");
    let spoke = apps(&t.spoke("m1")?, ARGOCD_NS);
    let targets = workload(&t, &r, &agents, APPS).await?;
    // Status only: the spoke's writes flow up, and only the agent's owner writes them to the hub.
    let status: Vec<Target> = targets.into_iter().filter(|t| t.field == Field::Revision).collect();
    let mut settle = Churn::start(status.clone(), Duration::from_millis(100));
    wait_until_async(CONVERGE, "status writes before the partition", || async { settle.count() >= 3 }).await?;
    settle.stop().await?;
    settle.converged(CONVERGE, || format!("{}\n{}", r.logs(), t.logs())).await?;
    // Between writes: the last status is on the hub, nothing of m1 is in flight.
    let partitioned_at = chrono::Utc::now();
    let start = Instant::now();
    proxy.blackhole(true);
    let mut churn = Churn::start(status.clone(), Duration::from_millis(150));

    // rp lapses and closes the stream; rq takes the agent.
    let what = "agent m1 to move to rq";
    let (holder, moved_transitions) = wait_owner(&t.hub(), "m1", CONVERGE, what, |h, n| h == "rq" && n > transitions)
        .await
        .with_context(|| format!("{}\n{}", r.logs(), t.logs()))?;
    let moved = start.elapsed();
    let lapsed = r.replica(0).log_lines("the replica's Lease lapsed");
    let lapse_line = lapsed.first().with_context(|| format!("rp never gave its agents up\n{}", r.logs()))?;
    let lapse = log_time(lapse_line).context("no time on rp's lapse line")?;
    let lapse_after = (lapse - partitioned_at).to_std().unwrap_or_default();
    ensure!(
        lapse_after <= r.duration(),
        "rp gave its agents up {lapse_after:?} after the partition, not within the Lease duration {:?}",
        r.duration()
    );
    let told = t.agent_log_lines("m1", "cannot renew its Lease");
    ensure!(!told.is_empty(), "m1's stream did not end with rp's lapse\n{}", t.logs());
    let refused = r.replica(0).readyz().await;
    ensure!(refused == Some(503), "rp answers /readyz {refused:?} while cut off from the hub");
    // Status keeps flowing, now through rq.
    let during = churn.count();
    // Every Application's status written again after the takeover (so through rq).
    let what = "status writes during the partition";
    wait_until_async(CONVERGE, what, || async { churn.count() >= during + 3 * APPS }).await?;
    churn.stop().await?;
    churn.converged(CONVERGE, || format!("{}\n{}", r.logs(), t.logs())).await?;

    // Heal; rp renews (ready again), and a last status goes through rq after that.
    let healed_at = chrono::Utc::now();
    proxy.blackhole(false);
    wait_until_async(CONVERGE, "rp to be ready again", || async { r.replica(0).readyz().await == Some(200) })
        .await
        .with_context(|| r.logs())?;
    let mut last = Churn::start(status.clone(), Duration::from_millis(100));
    wait_until_async(CONVERGE, "a status write after the heal", || async { last.count() >= APPS }).await?;
    last.stop().await?;
    last.converged(CONVERGE, || format!("{}\n{}", r.logs(), t.logs())).await?;
    ensure!(owner(&t.hub(), "m1").await?.is_some_and(|(h, _)| h == "rq"), "m1 left rq after the heal");

    // What rp wrote, from the hub's own record.
    let audit = read_audit(&log)?;
    let apps_by = |user: &str| -> Vec<Audited> {
        audit.iter().filter(|e| e.user == user && e.resource == "applications").cloned().collect()
    };
    let (p_writes, q_writes) = (apps_by(&p_user), apps_by(&q_user));
    ensure!(!p_writes.is_empty(), "rp made no Application write before the partition: the test proves nothing");
    ensure!(!q_writes.is_empty(), "rq made no Application write after taking the agent");
    let when_written = |value: &str| -> Option<chrono::DateTime<chrono::Utc>> {
        churn.writes().iter().find(|w| w.value == value).map(|w| w.sent_wall)
    };
    let mut in_flight = Vec::new();
    for w in p_writes.iter().filter(|w| w.received >= partitioned_at) {
        let value = w.body["status"]["sync"]["revision"].as_str().unwrap_or_default().to_owned();
        let spoke_write = when_written(&value);
        in_flight.push(format!(
            "{} {} {value} (spoke write {:?}, received {:?} after the heal) -> {}",
            w.verb,
            w.name,
            spoke_write.map(|s| s - partitioned_at),
            w.received - healed_at,
            w.code
        ));
        ensure!(w.received >= healed_at, "rp's write landed during the partition (the proxy leaked): {w:?}");
        // rq wrote m1's status since (the conditional patch's resourceVersion moved on): a late
        // write of rp's that still applied would put an older status over a newer one.
        ensure!(
            !(200..300).contains(&w.code),
            "rp's write held in the partition applied after the heal (a stale status over rq's): {w:?}"
        );
        ensure!(
            !w.body["metadata"]["resourceVersion"].is_null(),
            "rp's write held in the partition was not conditional on a resourceVersion: {w:?}"
        );
        // A write rp started after its lapse would carry a value the spoke wrote after it.
        let started_after_lapse = spoke_write.is_none_or(|s| s >= lapse);
        ensure!(
            !started_after_lapse,
            "rp wrote a status for m1 that the spoke only wrote after rp lost the agent ({value}, lapse at {lapse}): {w:?}"
        );
    }
    let p_leases: Vec<String> = audit
        .iter()
        .filter(|e| e.user == p_user && e.resource == "leases" && e.received >= partitioned_at)
        .map(|e| format!("{} {} -> {}", e.verb, e.name, e.code))
        .collect();
    ensure!(
        !p_leases.iter().any(|l| l.contains("argocd-agent-owner-m1")),
        "rp wrote m1's Lease after the partition: {p_leases:?}"
    );
    // The hub ends with the spoke's last status, whatever landed late.
    let rev = |o: &DynamicObject| serde_json::to_value(o).map(|v| v["status"]["sync"]["revision"].clone());
    for i in 0..APPS {
        let name = format!("m1-app-{i}");
        let (on_hub, on_spoke) = (rev(&hub.get(&name).await?)?, rev(&spoke.get(&name).await?)?);
        ensure!(on_hub == on_spoke, "{name}: hub status {on_hub} but spoke status {on_spoke} at the end");
    }
    let q_live = r.replica(1).metric("argocd_principal_agent_lease_takeovers_total", "from=\"live\"").await;
    let q_expired = r.replica(1).metric("argocd_principal_agent_lease_takeovers_total", "from=\"expired\"").await;
    let fenced = r.replica(0).metric("argocd_principal_hub_writes_fenced_total", "").await;
    let lost = r.replica(0).metric("argocd_principal_agent_leases_lost_total", "").await;
    eprintln!(
        "partition: rp gave m1 up {lapse_after:?} after it began, m1 on {holder} (transitions {transitions} -> \
         {moved_transitions}) {moved:?} after it began; rp fenced {fenced:?} events, lost {lost:?} Leases; \
         rp's Application writes received after the heal ({}): {in_flight:?}; rp's Lease writes since the partition: \
         {p_leases:?}; rq's Application writes: {}; rq's takeovers: live {q_live:?}, expired {q_expired:?}",
        in_flight.len(),
        q_writes.len()
    );
    drop(proxy);
    Ok(())
}
