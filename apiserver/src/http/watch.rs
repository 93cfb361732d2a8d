//! Watch streams: newline-delimited `WatchEvent`s from a resourceVersion, with bookmarks,
//! timeouts, selector transitions and `410 Gone` when the history no longer reaches back.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::ctx::Ctx;
use super::list::matches;
use super::query::{Params, parse_rv};
use super::table::table_value;
use crate::error::{ApiError, ApiResult};
use crate::object::meta_str;
use crate::store::{EventKind, StoredEvent};

/// Events buffered per watcher before the writer waits for the client.
const WATCH_BUFFER: usize = 128;

struct Watcher {
    ctx: Ctx,
    namespace: Option<String>,
    params: Params,
    table: bool,
    sent_columns: bool,
    tx: mpsc::Sender<Bytes>,
}

impl Watcher {
    fn in_scope(&self, obj: &Value) -> bool {
        self.namespace.as_deref().is_none_or(|ns| meta_str(obj, "namespace") == ns) && matches(&self.params, obj)
    }

    fn line(&mut self, kind: &str, obj: &Value, encoded: Option<&Bytes>) -> Bytes {
        let mut buf = BytesMut::with_capacity(64 + encoded.map_or(512, Bytes::len));
        buf.put_slice(b"{\"type\":\"");
        buf.put_slice(kind.as_bytes());
        buf.put_slice(b"\",\"object\":");
        if self.table {
            let t = table_value(
                &self.ctx.rtype,
                &[Arc::new(obj.clone())],
                meta_str(obj, "resourceVersion"),
                None,
                !self.sent_columns,
            );
            self.sent_columns = true;
            buf.put_slice(&serde_json::to_vec(&t).unwrap_or_default());
        } else {
            let want = self.ctx.rtype.api_version(&self.ctx.version);
            match encoded {
                Some(e) if obj.get("apiVersion").and_then(Value::as_str) == Some(want.as_str()) => buf.put_slice(e),
                _ => buf.put_slice(&self.ctx.encode(obj)),
            }
        }
        buf.put_slice(b"}\n");
        buf.freeze()
    }

    async fn send(&self, line: Bytes) -> bool {
        self.tx.send(line).await.is_ok()
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.ctx.rtype.kind, "apiVersion": self.ctx.rtype.api_version(&self.ctx.version), "metadata": meta});
        Bytes::from(format!("{}\n", json!({"type": "BOOKMARK", "object": obj})))
    }

    fn error(e: &ApiError) -> Bytes {
        Bytes::from(format!("{}\n", json!({"type": "ERROR", "object": e.to_status()})))
    }

    /// What one stored event looks like to this watcher, if anything.
    fn translate(&mut self, ev: &StoredEvent) -> Option<Bytes> {
        let now_in = self.in_scope(&ev.object);
        let was_in = ev.old.as_ref().is_some_and(|o| self.in_scope(o));
        let kind = match (ev.kind, was_in, now_in) {
            (EventKind::Added, _, true) => "ADDED",
            (EventKind::Deleted, _, true) => "DELETED",
            (EventKind::Modified, true, true) => "MODIFIED",
            // Selector transitions: entering the selection is an add, leaving it a delete.
            (EventKind::Modified, false, true) => "ADDED",
            (EventKind::Modified, true, false) => "DELETED",
            _ => return None,
        };
        Some(self.line(kind, &ev.object, Some(ev.encoded_object())))
    }

    async fn run(mut self, start: Start) {
        let store = self.ctx.state.store.clone();
        let mut changes = store.subscribe();
        let mut shutdown = self.ctx.state.shutdown.clone();
        let timeout = self.params.timeout_seconds.map_or(self.ctx.state.max_watch, Duration::from_secs);
        let deadline = Instant::now() + timeout;
        let interval = self.ctx.state.bookmark_interval;
        let mut pos = match start {
            Start::From(rv) => rv,
            Start::Snapshot { send_initial_bookmark } => {
                let (items, rv) = store.list(&self.ctx.gr(), self.namespace.as_deref(), None);
                for (_, obj) in items {
                    if self.in_scope(&obj) {
                        let line = self.line("ADDED", &obj, None);
                        if !self.send(line).await {
                            return;
                        }
                    }
                }
                if send_initial_bookmark && !self.send(self.bookmark(rv, true)).await {
                    return;
                }
                rv
            }
        };
        let mut next_bookmark = Instant::now() + interval;
        loop {
            match store.events_since(pos, &self.ctx.gr()) {
                Err(e) => {
                    let _ = self.send(Self::error(&e)).await;
                    return;
                }
                Ok((events, latest)) => {
                    for ev in events {
                        if let Some(line) = self.translate(&ev)
                            && !self.send(line).await
                        {
                            return;
                        }
                        pos = ev.rv;
                    }
                    pos = pos.max(latest);
                }
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(deadline) => {
                    if self.params.allow_bookmarks {
                        let _ = self.send(self.bookmark(pos, false)).await;
                    }
                    return;
                }
                () = tokio::time::sleep_until(next_bookmark) => {
                    next_bookmark = Instant::now() + interval;
                    if self.params.allow_bookmarks && !self.send(self.bookmark(pos, false)).await {
                        return;
                    }
                }
                _ = shutdown.changed() => return,
                () = self.tx.closed() => return,
            }
        }
    }
}

enum Start {
    From(u64),
    Snapshot { send_initial_bookmark: bool },
}

pub(crate) fn serve(ctx: &Ctx, namespace: Option<&str>, params: &Params, table: bool) -> ApiResult<Response> {
    let start = match params.resource_version.as_deref() {
        None | Some("0") => Start::Snapshot { send_initial_bookmark: params.send_initial_events },
        Some(rv) if params.send_initial_events => {
            parse_rv(rv)?;
            Start::Snapshot { send_initial_bookmark: true }
        }
        Some(rv) => Start::From(parse_rv(rv)?),
    };
    let (tx, rx) = mpsc::channel(WATCH_BUFFER);
    let watcher = Watcher {
        ctx: ctx.clone(),
        namespace: namespace.map(str::to_string),
        params: Params {
            labels: params.labels.clone(),
            fields: params.fields.clone(),
            selectable: params.selectable,
            timeout_seconds: params.timeout_seconds,
            allow_bookmarks: params.allow_bookmarks,
            ..Params::default()
        },
        table,
        sent_columns: false,
        tx,
    };
    tokio::spawn(watcher.run(start));
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let body = Body::from_stream(futures::StreamExt::map(stream, Ok::<_, std::convert::Infallible>));
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    Ok(resp)
}
