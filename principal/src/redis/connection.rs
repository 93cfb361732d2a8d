//! One client connection of the Redis proxy, with its own connection to the hub's Redis.
//!
//! Three tasks share the connection:
//! * the **reader** (the connection's own task) reads the client's commands
//!   ([`protocol::resp::Scanner`], [`Request`]); a `GET` or `SUBSCRIBE` of an agent's key is
//!   answered by that agent (a background task asks it), anything else is forwarded to the
//!   hub's Redis byte for byte. Each command takes a numbered slot (and a permit: at most
//!   [`super::RedisProxyConfig::max_pipeline`] commands are unanswered at once, then the reader
//!   stops reading);
//! * the **hub reader** delimits the hub's replies and pushes;
//! * the **writer** writes the replies in the order of the commands: the hub's replies are
//!   matched to the slots of the commands it was sent, the agents' answers fill theirs when
//!   they come. RESP3 pushes and messages on agent channels go out as they come (they answer
//!   no command). After a command that makes the hub send frames answering no command (in
//!   RESP2 every pub/sub reply, `MONITOR`, `CLIENT REPLY`; upstream never checks), the hub's
//!   frames pass through in arrival order.
//!
//! The writer tracks the protocol version (`HELLO`, `RESET`) to encode the proxy's own
//! replies as the client expects them.
//!
//! **Before authentication, Redis's own bounds.** A client that has not authenticated may send
//! commands of at most 10 arguments of at most 16 KiB each, as Redis itself allows since 6.2.6
//! (CVE-2021-32675): a larger count or length is refused on its header, before the proxy reads
//! (let alone buffers) what it declares, with Redis's own error, and the connection is closed.
//! Authenticated means what Redis means: before reading the client, the proxy sends `PING` to
//! the hub's Redis on the connection; a `PONG` (the hub's default user needs no password) makes
//! every client authenticated from the start, as in Redis; otherwise the client is authenticated
//! once the hub has accepted its `AUTH` or `HELLO` (the proxy waits for that answer before
//! reading the next command, as Redis executes `AUTH` before it parses what follows), and again
//! not after `RESET`. Authenticated clients' frames, and the hub's replies, are bounded by
//! [`super::RedisProxyConfig::limits`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use protocol::resp::{Command, Frame, Grammar, Limits, Reply, Request, ScanError, Scanner, Version};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::RedisProxy;
use super::exchange::Inbox;
use super::forward::{self, Route};
use super::read::{self, Read};
use super::route::{AgentKey, agent_key};

/// How a forwarded command's answer comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HubMeta {
    /// One reply.
    Plain,
    /// One reply; on success the protocol version becomes the one asked for.
    Hello(Option<u8>),
    /// One reply; the protocol version becomes RESP2.
    Reset,
    /// Frames that answer no command follow: from here on the hub's frames pass through.
    Unpaired,
    /// The proxy's own `PING`, whose reply tells whether the connection may read agents'
    /// state; not written to the client.
    Probe,
}

/// A command's place in the order of replies.
#[derive(Debug)]
enum Slot {
    /// Forwarded to the hub's Redis; `answer`, if any, learns whether the hub's reply was a
    /// success (not when the connection's replies pass through unchecked).
    Hub { seq: u64, meta: HubMeta, permit: OwnedSemaphorePermit, answer: Option<oneshot::Sender<bool>> },
    /// Answered by the proxy (an agent's answer, or an error), through [`Done`].
    Local { seq: u64, permit: OwnedSemaphorePermit },
    /// The proxy's `PING` to the hub on this connection: `answer` learns whether it succeeded
    /// (the hub's error otherwise, e.g. `NOAUTH`).
    Probe { seq: u64, permit: OwnedSemaphorePermit, answer: oneshot::Sender<Result<(), String>> },
}

/// The proxy's own answer to slot `seq`.
#[derive(Debug)]
struct Done {
    seq: u64,
    replies: Vec<Reply>,
    /// Close the connection after writing (the client then reconnects).
    close: bool,
}

/// One frame from the hub's Redis.
#[derive(Debug)]
struct HubFrame {
    bytes: Bytes,
    frame: Frame,
}

/// Serves one client connection until either side closes it or `cancel` fires.
pub(super) async fn serve<IO>(proxy: RedisProxy, client: IO, cancel: CancellationToken)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let id = protocol::event::new_uuid();
    let (client_rd, mut client_wr) = tokio::io::split(client);
    let upstream = match proxy.dial().await {
        Ok(upstream) => upstream,
        Err(error) => {
            tracing::warn!(conn = %id, upstream = %proxy.config.upstream, %error, "cannot reach the hub's Redis");
            let reply = Reply::Error(format!(
                "the Argo CD agent's Redis proxy cannot reach the hub's Redis at {}: {error}",
                proxy.config.upstream
            ));
            let _ = client_wr.write_all(&reply.encode(Version::Resp2)).await;
            let _ = client_wr.shutdown().await;
            return;
        }
    };
    tracing::debug!(conn = %id, "Redis proxy connection opened");
    let (hub_rd, hub_wr) = tokio::io::split(upstream);
    let cancel = cancel.child_token();
    let inbox = proxy.exchange.open(&id);
    let (slots_tx, slots_rx) = mpsc::unbounded_channel();
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let (hub_tx, hub_rx) = mpsc::channel(64);
    let hub_reader = tokio::spawn(read_hub(hub_rd, hub_tx, proxy.config.limits, cancel.clone()));
    let writer = tokio::spawn({
        let writer = Writer::new(tokio::io::BufWriter::new(client_wr), cancel.clone());
        writer.run(slots_rx, done_rx, hub_rx, inbox)
    });
    let reader = Reader {
        proxy: proxy.clone(),
        id: id.clone(),
        slots: slots_tx,
        done: done_tx,
        permits: Arc::new(Semaphore::new(proxy.config.max_pipeline.max(1))),
        seq: 0,
        cancel: cancel.clone(),
        authorized: false,
        unpaired: false,
        authenticated: false,
        open: false,
    };
    reader.run(client_rd, tokio::io::BufWriter::new(hub_wr)).await;
    let _ = writer.await;
    cancel.cancel();
    let _ = hub_reader.await;
    proxy.exchange.close(&id);
    tracing::debug!(conn = %id, "Redis proxy connection closed");
}

/// Delimits the hub's frames and hands them to the writer.
async fn read_hub<R>(mut rd: R, tx: mpsc::Sender<HubFrame>, limits: protocol::resp::Limits, cancel: CancellationToken)
where
    R: AsyncRead + Unpin,
{
    let mut scanner = Scanner::new(Grammar::Reply, limits);
    let mut buf = BytesMut::with_capacity(16 << 10);
    loop {
        loop {
            match scanner.scan(&buf) {
                Ok(Some(frame)) => {
                    let bytes = buf.split_to(frame.len).freeze();
                    if tx.send(HubFrame { bytes, frame }).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(%error, "the hub's Redis sent what is not RESP; the connection is closed");
                    cancel.cancel();
                    return;
                }
            }
        }
        let read = tokio::select! {
            () = cancel.cancelled() => return,
            read = rd.read_buf(&mut buf) => read,
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// The client's side: commands in, routed.
struct Reader {
    proxy: RedisProxy,
    id: String,
    slots: mpsc::UnboundedSender<Slot>,
    done: mpsc::UnboundedSender<Done>,
    permits: Arc<Semaphore>,
    seq: u64,
    cancel: CancellationToken,
    /// The hub's Redis answered a `PING` on this connection since it last authenticated: the
    /// client may read agents' state (what it may not read from the hub, it may not read
    /// from agents either).
    authorized: bool,
    /// A command made the hub's frames pass through (pub/sub in RESP2, `MONITOR`, ...).
    unpaired: bool,
    /// The hub's Redis takes the client as authenticated: its frames are bounded by the
    /// configured limits, not Redis's pre-authentication ones (see the module docs).
    authenticated: bool,
    /// The hub's Redis answered the first `PING` (its default user needs no password): what a
    /// `RESET` returns the connection to.
    open: bool,
}

impl Reader {
    async fn run<R, W>(mut self, mut rd: R, mut hub: W)
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        // Whether the hub takes the client as authenticated before any AUTH: asked before a
        // byte of the client is read, so that its first command is bounded as Redis would.
        self.open = self.authorize(&mut hub).await.is_ok();
        self.authenticated = self.open;
        let mut scanner = Scanner::new(Grammar::Command, self.limits());
        let mut buf = BytesMut::with_capacity(16 << 10);
        loop {
            loop {
                scanner.set_limits(self.limits());
                let frame = match scanner.scan(&buf) {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(error) => {
                        // Redis answers a protocol error and closes; so does the proxy, once
                        // what came before is forwarded (its replies come first).
                        let _ = hub.flush().await;
                        let message = refusal(&error, self.authenticated);
                        tracing::debug!(conn = %self.id, authenticated = self.authenticated, %message, "Redis proxy client refused");
                        self.fail(&message).await;
                        return;
                    }
                };
                let raw = buf.split_to(frame.len).freeze();
                let request = match Request::decode(raw) {
                    Ok(r) => r,
                    Err(error) => {
                        let _ = hub.flush().await;
                        self.fail(&error.to_string()).await;
                        return;
                    }
                };
                if !self.handle(request, &mut hub).await {
                    return;
                }
            }
            if hub.flush().await.is_err() {
                self.cancel.cancel();
                return;
            }
            let read = tokio::select! {
                () = self.cancel.cancelled() => return,
                read = rd.read_buf(&mut buf) => read,
            };
            match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// The bounds on the client's next command: the configured ones once it has
    /// authenticated, Redis's pre-authentication ones until then.
    fn limits(&self) -> Limits {
        let limits = self.proxy.config.limits;
        if self.authenticated { limits } else { limits.unauthenticated() }
    }

    /// A numbered slot's permit, waiting while too many commands are unanswered.
    async fn permit(&mut self) -> Option<(u64, OwnedSemaphorePermit)> {
        let permit = tokio::select! {
            () = self.cancel.cancelled() => return None,
            permit = self.permits.clone().acquire_owned() => permit.ok()?,
        };
        self.seq += 1;
        Some((self.seq, permit))
    }

    /// Writes `message` as the last reply and ends the connection.
    async fn fail(&mut self, message: &str) {
        if let Some((seq, permit)) = self.permit().await {
            let _ = self.slots.send(Slot::Local { seq, permit });
            let _ = self.done.send(Done { seq, replies: vec![Reply::Error(message.to_owned())], close: true });
        }
    }

    /// Routes one command; `false` ends the connection.
    async fn handle<W: AsyncWrite + Unpin>(&mut self, request: Request, hub: &mut W) -> bool {
        // About to wait for a permit: what was forwarded must reach the hub, or its replies
        // (which free permits) never come.
        if self.permits.available_permits() == 0 && hub.flush().await.is_err() {
            self.cancel.cancel();
            return false;
        }
        let command = request.command();
        let auth = request.name() == "AUTH";
        if matches!(command, Command::Hello(_) | Command::Reset) || auth {
            // The connection's identity may change: check it again before the next agent read.
            self.authorized = false;
        }
        if matches!(command, Command::Reset) {
            // Redis's RESET returns the connection to the default user.
            self.authenticated = self.open;
        }
        if !self.authenticated && (auth || matches!(command, Command::Hello(_))) {
            let meta = match command {
                Command::Hello(version) => HubMeta::Hello(version),
                _ => HubMeta::Plain,
            };
            return self.authenticate(request.raw(), meta, hub).await;
        }
        match command {
            Command::Empty => true,
            Command::Get(key) => match agent_key(&self.proxy.hub, key) {
                Some(target) => {
                    if let Err(refused) = self.authorize(hub).await {
                        return self.reply(refused).await;
                    }
                    let key = String::from_utf8_lossy(key).into_owned();
                    self.local(move |proxy, conn| get(proxy, conn, target, key)).await
                }
                None => self.forward(request.raw(), HubMeta::Plain, hub).await,
            },
            Command::Subscribe(channels) => {
                let mut agents = Vec::new();
                let mut others = Vec::new();
                for channel in channels {
                    match agent_key(&self.proxy.hub, channel) {
                        Some(target) => agents.push((target.agent, String::from_utf8_lossy(channel).into_owned())),
                        None => others.push(channel.clone()),
                    }
                }
                if agents.is_empty() {
                    return self.forward(request.raw(), HubMeta::Unpaired, hub).await;
                }
                if let Err(refused) = self.authorize(hub).await {
                    return self.reply(refused).await;
                }
                let cancel = self.cancel.clone();
                if !self.local(move |proxy, conn| subscribe(proxy, conn, agents, cancel)).await {
                    return false;
                }
                if others.is_empty() {
                    return true;
                }
                let mut args = vec![request.args()[0].clone()];
                args.extend(others);
                self.forward(Request::from_args(args).raw(), HubMeta::Unpaired, hub).await
            }
            Command::Hello(version) => self.forward(request.raw(), HubMeta::Hello(version), hub).await,
            Command::Reset => self.forward(request.raw(), HubMeta::Reset, hub).await,
            Command::Unpaired | Command::Unsubscribe => self.forward(request.raw(), HubMeta::Unpaired, hub).await,
            Command::Other => self.forward(request.raw(), HubMeta::Plain, hub).await,
        }
    }

    /// Whether the client may read agents' state: once per authentication, the proxy sends
    /// `PING` to the hub's Redis on this connection and waits for the reply (with a password
    /// on the hub's Redis, an unauthenticated connection gets `NOAUTH`, passed on here).
    /// Upstream reads agents' state for any client.
    async fn authorize<W: AsyncWrite + Unpin>(&mut self, hub: &mut W) -> Result<(), Reply> {
        if self.authorized {
            return Ok(());
        }
        if self.unpaired {
            return Err(Reply::Error(
                "ERR agents' keys cannot be read on this connection: it is in a mode where the proxy cannot check \
                 it with the hub's Redis (pub/sub of the hub's channels, MONITOR, CLIENT REPLY); use another connection"
                    .to_owned(),
            ));
        }
        let closed = || Reply::Error("ERR the connection is closing".to_owned());
        let (seq, permit) = self.permit().await.ok_or_else(closed)?;
        let (answer, result) = oneshot::channel();
        if self.slots.send(Slot::Probe { seq, permit, answer }).is_err() {
            return Err(closed());
        }
        let ping = Request::from_args(vec![Bytes::from_static(b"PING")]);
        if hub.write_all(ping.raw()).await.is_err() || hub.flush().await.is_err() {
            self.cancel.cancel();
            return Err(closed());
        }
        let timeout = self.proxy.config.request_timeout;
        match tokio::time::timeout(timeout, result).await {
            Ok(Ok(Ok(()))) => {
                self.authorized = true;
                Ok(())
            }
            Ok(Ok(Err(refused))) => Err(Reply::Error(refused)),
            Ok(Err(_)) => Err(closed()),
            Err(_) => Err(Reply::Error(format!("ERR the hub's Redis did not answer PING within {timeout:?}"))),
        }
    }

    /// Answers the next slot with `reply` at once.
    async fn reply(&mut self, reply: Reply) -> bool {
        let Some((seq, permit)) = self.permit().await else { return false };
        self.slots.send(Slot::Local { seq, permit }).is_ok()
            && self.done.send(Done { seq, replies: vec![reply], close: false }).is_ok()
    }

    /// Forwards `AUTH` or `HELLO` of a client that has not authenticated and waits for the hub's
    /// answer (at most the request timeout) before the next command is read: a success makes
    /// the client authenticated. `false` ends the connection.
    async fn authenticate<W: AsyncWrite + Unpin>(&mut self, raw: &Bytes, meta: HubMeta, hub: &mut W) -> bool {
        let (answer, result) = oneshot::channel();
        if !self.forward_with(raw, meta, Some(answer), hub).await {
            return false;
        }
        if hub.flush().await.is_err() {
            self.cancel.cancel();
            return false;
        }
        let timeout = self.proxy.config.request_timeout;
        tokio::select! {
            () = self.cancel.cancelled() => return false,
            answered = tokio::time::timeout(timeout, result) => {
                // No answer in time, or none the proxy can check: still not authenticated.
                self.authenticated = matches!(answered, Ok(Ok(true)));
            }
        }
        true
    }

    /// Forwards `raw` to the hub's Redis, its reply expected as `meta` says.
    async fn forward<W: AsyncWrite + Unpin>(&mut self, raw: &Bytes, meta: HubMeta, hub: &mut W) -> bool {
        self.forward_with(raw, meta, None, hub).await
    }

    /// [`Self::forward`], `answer` learning whether the reply was a success.
    async fn forward_with<W: AsyncWrite + Unpin>(
        &mut self,
        raw: &Bytes,
        meta: HubMeta,
        answer: Option<oneshot::Sender<bool>>,
        hub: &mut W,
    ) -> bool {
        if meta == HubMeta::Unpaired {
            self.unpaired = true;
        }
        let Some((seq, permit)) = self.permit().await else { return false };
        // The slot first: the writer must know of it before the reply can arrive.
        if self.slots.send(Slot::Hub { seq, meta, permit, answer }).is_err() {
            return false;
        }
        if hub.write_all(raw).await.is_err() {
            self.cancel.cancel();
            return false;
        }
        true
    }

    /// Answers the next slot with what `work` returns, in the background.
    async fn local<F, Fut>(&mut self, work: F) -> bool
    where
        F: FnOnce(RedisProxy, String) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = (Vec<Reply>, bool)> + Send + 'static,
    {
        let Some((seq, permit)) = self.permit().await else { return false };
        if self.slots.send(Slot::Local { seq, permit }).is_err() {
            return false;
        }
        let (proxy, conn, done, cancel) = (self.proxy.clone(), self.id.clone(), self.done.clone(), self.cancel.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                (replies, close) = work(proxy, conn) => {
                    let _ = done.send(Done { seq, replies, close });
                }
            }
        });
        true
    }
}

/// `GET` of an agent's key: the agent's value, a miss, or an error naming the cause; read here,
/// or at the replica that owns the agent ([`forward`]).
async fn get(proxy: RedisProxy, conn: String, target: AgentKey, key: String) -> (Vec<Reply>, bool) {
    let read = match forward::route(&proxy, &target.agent) {
        Route::Here => read::get(&proxy, &conn, &target, &key).await,
        Route::Owner { owner, address, link } => {
            forward::get(&proxy.pool, &owner, &address, &link, &target.agent, &key, proxy.config.request_timeout).await
        }
        Route::Refused(why) => {
            crate::metrics::global().redis_request(
                &target.agent,
                "get",
                "error",
                Some("owner_elsewhere"),
                Duration::ZERO,
            );
            Read::Failed(why)
        }
    };
    let reply = match read {
        Read::Hit(value) => Reply::Bulk(value.into()),
        Read::Miss => Reply::Nil,
        Read::Failed(why) => Reply::Error(why),
    };
    (vec![reply], false)
}

/// `SUBSCRIBE` of agents' channels: each agent subscribes in its own Redis and pushes
/// messages (through the replica that owns it, when another does); a failure closes the
/// connection (so the client reconnects and subscribes again, which go-redis does by itself).
async fn subscribe(
    proxy: RedisProxy,
    conn: String,
    channels: Vec<(String, String)>,
    cancel: CancellationToken,
) -> (Vec<Reply>, bool) {
    let mut replies = Vec::new();
    for (agent, channel) in channels {
        // Registered first: a message may follow the agent's answer at once.
        let (count, first) = proxy.exchange.subscribed(&conn, &agent, &channel);
        let subscribed = match forward::route(&proxy, &agent) {
            Route::Here => {
                let subscribed = read::subscribe(&proxy, &conn, &agent, &channel).await;
                if subscribed.is_ok() && first {
                    tokio::spawn(read::keep_alive(proxy.clone(), conn.clone(), agent.clone(), cancel.clone()));
                }
                subscribed
            }
            // The owner pings its agent for the subscription.
            Route::Owner { owner, address, link } => {
                forward::subscribe(&proxy, (&owner, &address, &link), &conn, &agent, &channel, cancel.clone()).await
            }
            Route::Refused(why) => Err(why),
        };
        if let Err(message) = subscribed {
            tracing::info!(conn, %agent, %channel, %message, "Redis SUBSCRIBE through the agent failed; connection closed");
            replies.push(Reply::Error(message));
            return (replies, true);
        }
        replies.push(Reply::Subscribed {
            channel: Bytes::from(channel.into_bytes()),
            count: i64::try_from(count).unwrap_or(i64::MAX),
        });
    }
    (replies, false)
}

/// What the client is told when its bytes are refused: Redis's own words for the bounds before
/// authentication (`ERR Protocol error: unauthenticated multibulk length`, `... bulk length`,
/// networking.c since Redis 6.2.6), the scanner's otherwise.
fn refusal(error: &ScanError, authenticated: bool) -> String {
    match error {
        ScanError::TooManyElements { .. } if !authenticated => {
            "Protocol error: unauthenticated multibulk length".into()
        }
        ScanError::BulkTooLong { .. } if !authenticated => "Protocol error: unauthenticated bulk length".into(),
        other => other.to_string(),
    }
}

/// The message of an error frame (`-NOAUTH Authentication required.` without `-` and CRLF).
fn error_text(frame: &[u8]) -> String {
    let text = frame.strip_prefix(b"-").and_then(|f| f.strip_suffix(b"\r\n")).unwrap_or(b"ERR the hub's Redis refused");
    String::from_utf8_lossy(text).into_owned()
}

/// A reply waiting for its turn.
#[derive(Debug, Default)]
struct Ready {
    raw: Vec<Bytes>,
    replies: Vec<Reply>,
    /// The protocol version from this reply on.
    version_after: Option<Version>,
    close: bool,
}

/// Frames passed through held while earlier replies are still due (bounded).
const MAX_HELD: usize = 1024;

/// The client's side: replies out, in order.
struct Writer<W> {
    out: W,
    cancel: CancellationToken,
    /// The next slot to write.
    next: u64,
    ready: BTreeMap<u64, Ready>,
    /// Slots registered and not yet written (dropping a permit lets the reader go on).
    permits: HashMap<u64, OwnedSemaphorePermit>,
    /// Forwarded commands whose reply has not come, in order.
    expect: VecDeque<(u64, HubMeta)>,
    /// Who waits for the reply to each probe.
    probes: HashMap<u64, oneshot::Sender<Result<(), String>>>,
    /// Who waits to learn whether a forwarded command succeeded (`AUTH` before authentication).
    answers: HashMap<u64, oneshot::Sender<bool>>,
    /// The protocol version as the hub's replies so far set it, and as the client has seen it.
    hub_version: Version,
    write_version: Version,
    /// From this slot on, the hub's frames pass through in arrival order.
    passthrough: Option<u64>,
    held: Vec<Bytes>,
}

/// Why the writer stopped.
enum Stop {
    Closed,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    fn new(out: W, cancel: CancellationToken) -> Self {
        Self {
            out,
            cancel,
            next: 1,
            ready: BTreeMap::new(),
            permits: HashMap::new(),
            expect: VecDeque::new(),
            probes: HashMap::new(),
            answers: HashMap::new(),
            hub_version: Version::Resp2,
            write_version: Version::Resp2,
            passthrough: None,
            held: Vec::new(),
        }
    }

    async fn run(
        mut self,
        mut slots: mpsc::UnboundedReceiver<Slot>,
        mut done: mpsc::UnboundedReceiver<Done>,
        mut hub: mpsc::Receiver<HubFrame>,
        mut inbox: Inbox,
    ) {
        let (mut slots_open, mut done_open, mut lost_open) = (true, true, true);
        let result: Result<(), Stop> = async {
            loop {
                tokio::select! {
                    biased;
                    () = self.cancel.cancelled() => return Err(Stop::Closed),
                    changed = inbox.lost.changed(), if lost_open => {
                        if changed.is_err() {
                            lost_open = false;
                        } else {
                            let reason = inbox.lost.borrow_and_update().clone();
                            if let Some(reason) = reason {
                                self.write_reply(&Reply::Error(reason)).await?;
                                return Err(Stop::Closed);
                            }
                        }
                    }
                    slot = slots.recv(), if slots_open => match slot {
                        Some(slot) => self.register(slot),
                        None => slots_open = false,
                    },
                    answer = done.recv(), if done_open => match answer {
                        Some(d) => {
                            self.ready.insert(d.seq, Ready { replies: d.replies, close: d.close, ..Ready::default() });
                        }
                        None => done_open = false,
                    },
                    frame = hub.recv() => match frame {
                        Some(frame) => {
                            while let Ok(slot) = slots.try_recv() {
                                self.register(slot);
                            }
                            self.hub_frame(frame).await?;
                        }
                        None => {
                            // The hub's Redis closed (QUIT, or it went away): what is due is written.
                            self.write_due().await?;
                            return Err(Stop::Closed);
                        }
                    },
                    Some(channel) = inbox.messages.recv() => {
                        self.write_reply(&Reply::Message { channel }).await?;
                    }
                }
                self.write_due().await?;
                self.out.flush().await.map_err(|_| Stop::Closed)?;
                if !slots_open && self.permits.is_empty() {
                    return Ok(());
                }
            }
        }
        .await;
        let _ = result;
        let _ = self.out.flush().await;
        let _ = self.out.shutdown().await;
        self.cancel.cancel();
    }

    fn register(&mut self, slot: Slot) {
        match slot {
            Slot::Probe { seq, permit, answer } => {
                self.permits.insert(seq, permit);
                self.ready.insert(seq, Ready::default());
                if self.passthrough.is_some() {
                    let _ = answer.send(Err("ERR the connection's replies pass through unchecked".to_owned()));
                } else {
                    self.probes.insert(seq, answer);
                    self.expect.push_back((seq, HubMeta::Probe));
                }
            }
            Slot::Local { seq, permit } => {
                self.permits.insert(seq, permit);
            }
            Slot::Hub { seq, meta, permit, answer } => {
                self.permits.insert(seq, permit);
                // Dropped unanswered where replies pass through: its reply cannot be told apart.
                if let Some(answer) = answer.filter(|_| self.passthrough.is_none() && meta != HubMeta::Unpaired) {
                    self.answers.insert(seq, answer);
                }
                if self.passthrough.is_some() {
                    self.ready.insert(seq, Ready::default());
                } else if meta == HubMeta::Unpaired {
                    self.passthrough = Some(seq);
                    self.ready.insert(seq, Ready::default());
                } else {
                    self.expect.push_back((seq, meta));
                }
            }
        }
    }

    async fn hub_frame(&mut self, frame: HubFrame) -> Result<(), Stop> {
        if frame.frame.is_push() {
            return self.write_raw(&frame.bytes).await;
        }
        let Some((seq, meta)) = self.expect.pop_front() else {
            return match self.passthrough {
                Some(from) if self.next > from => self.write_raw(&frame.bytes).await,
                Some(_) if self.held.len() < MAX_HELD => {
                    self.held.push(frame.bytes);
                    Ok(())
                }
                Some(_) => {
                    tracing::warn!(
                        "too many frames from the hub's Redis wait behind unanswered commands; connection closed"
                    );
                    Err(Stop::Closed)
                }
                None => {
                    tracing::warn!("the hub's Redis sent a reply to no command; connection closed");
                    Err(Stop::Closed)
                }
            };
        };
        let ok = !frame.frame.is_error();
        if let Some(answer) = self.answers.remove(&seq) {
            let _ = answer.send(ok);
        }
        if meta == HubMeta::Probe {
            // The slot is already ready (it writes nothing); only its caller learns the result.
            if let Some(answer) = self.probes.remove(&seq) {
                let _ = answer.send(if ok { Ok(()) } else { Err(error_text(&frame.bytes)) });
            }
            return Ok(());
        }
        let version_after = match meta {
            HubMeta::Hello(Some(v)) if ok => Some(if v == 3 { Version::Resp3 } else { Version::Resp2 }),
            HubMeta::Reset if ok => Some(Version::Resp2),
            _ => None,
        };
        if let Some(v) = version_after {
            self.hub_version = v;
        }
        self.ready.insert(seq, Ready { raw: vec![frame.bytes], version_after, ..Ready::default() });
        Ok(())
    }

    /// Writes every reply whose turn has come.
    async fn write_due(&mut self) -> Result<(), Stop> {
        while let Some(ready) = self.ready.remove(&self.next) {
            for raw in &ready.raw {
                self.write_raw(raw).await?;
            }
            for reply in &ready.replies {
                self.write_reply(reply).await?;
            }
            if let Some(v) = ready.version_after {
                self.write_version = v;
            }
            self.permits.remove(&self.next);
            self.next += 1;
            if ready.close {
                return Err(Stop::Closed);
            }
        }
        if self.passthrough.is_some_and(|from| self.next > from) && !self.held.is_empty() {
            for raw in std::mem::take(&mut self.held) {
                self.write_raw(&raw).await?;
            }
        }
        Ok(())
    }

    async fn write_raw(&mut self, bytes: &[u8]) -> Result<(), Stop> {
        self.out.write_all(bytes).await.map_err(|_| Stop::Closed)
    }

    async fn write_reply(&mut self, reply: &Reply) -> Result<(), Stop> {
        let bytes = reply.encode(self.write_version);
        self.write_raw(&bytes).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permit(sem: &Arc<Semaphore>) -> OwnedSemaphorePermit {
        sem.clone().try_acquire_owned().expect("permit")
    }

    fn frame(bytes: &'static [u8]) -> HubFrame {
        let f =
            Scanner::new(Grammar::Reply, protocol::resp::Limits::default()).scan(bytes).expect("valid").expect("whole");
        HubFrame { bytes: Bytes::from_static(bytes), frame: f }
    }

    /// Replies come out in the order of the commands, whoever answers first.
    #[tokio::test]
    async fn replies_keep_the_order_of_commands() {
        let sem = Arc::new(Semaphore::new(16));
        let mut w = Writer::new(Vec::new(), CancellationToken::new());
        w.register(Slot::Hub { seq: 1, meta: HubMeta::Hello(Some(3)), permit: permit(&sem), answer: None });
        w.register(Slot::Local { seq: 2, permit: permit(&sem) });
        w.register(Slot::Hub { seq: 3, meta: HubMeta::Plain, permit: permit(&sem), answer: None });
        w.hub_frame(frame(b"%1\r\n$5\r\nproto\r\n:3\r\n")).await.ok();
        w.hub_frame(frame(b"+OK\r\n")).await.ok();
        w.hub_frame(frame(b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$0\r\n\r\n")).await.ok();
        w.write_due().await.ok();
        assert_eq!(&w.out[..], b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$0\r\n\r\n%1\r\n$5\r\nproto\r\n:3\r\n");
        assert_eq!(sem.available_permits(), 14, "the written slot frees its permit");
        w.ready.insert(2, Ready { replies: vec![Reply::Nil], ..Ready::default() });
        w.write_due().await.ok();
        assert!(
            w.out.ends_with(b":3\r\n_\r\n+OK\r\n"),
            "RESP3 null after HELLO 3: {:?}",
            String::from_utf8_lossy(&w.out)
        );
        assert_eq!(sem.available_permits(), 16);
    }

    /// After a RESP2 SUBSCRIBE to the hub, the hub's frames pass through as they come.
    #[tokio::test]
    async fn pubsub_replies_pass_through() {
        let sem = Arc::new(Semaphore::new(16));
        let mut w = Writer::new(Vec::new(), CancellationToken::new());
        w.register(Slot::Local { seq: 1, permit: permit(&sem) });
        w.register(Slot::Hub { seq: 2, meta: HubMeta::Unpaired, permit: permit(&sem), answer: None });
        w.register(Slot::Hub { seq: 3, meta: HubMeta::Plain, permit: permit(&sem), answer: None });
        w.hub_frame(frame(b"*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n")).await.ok();
        w.write_due().await.ok();
        assert!(w.out.is_empty(), "held behind the unanswered slot 1");
        w.ready.insert(1, Ready { replies: vec![Reply::Bulk(Bytes::from_static(b"v"))], ..Ready::default() });
        w.write_due().await.ok();
        assert_eq!(&w.out[..], b"$1\r\nv\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n");
        w.hub_frame(frame(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n")).await.ok();
        assert!(w.out.ends_with(b"pong\r\n$0\r\n\r\n"));
        assert!(w.permits.is_empty());
    }

    /// The proxy's probe: its reply goes to the reader, never to the client.
    #[tokio::test]
    async fn probes_are_answered_to_the_proxy_only() {
        let sem = Arc::new(Semaphore::new(16));
        let mut w = Writer::new(Vec::new(), CancellationToken::new());
        let (tx, rx) = oneshot::channel();
        w.register(Slot::Probe { seq: 1, permit: permit(&sem), answer: tx });
        w.register(Slot::Hub { seq: 2, meta: HubMeta::Plain, permit: permit(&sem), answer: None });
        w.hub_frame(frame(b"-NOAUTH Authentication required.\r\n")).await.ok();
        w.hub_frame(frame(b"-NOAUTH Authentication required.\r\n")).await.ok();
        w.write_due().await.ok();
        assert_eq!(rx.await.expect("answered"), Err("NOAUTH Authentication required.".to_owned()));
        assert_eq!(&w.out[..], b"-NOAUTH Authentication required.\r\n", "only the client's own command's reply");
        let (tx, rx) = oneshot::channel();
        w.register(Slot::Probe { seq: 3, permit: permit(&sem), answer: tx });
        w.hub_frame(frame(b"+PONG\r\n")).await.ok();
        assert_eq!(rx.await.expect("answered"), Ok(()));
    }

    #[tokio::test]
    async fn a_reply_to_no_command_closes_the_connection() {
        let mut w = Writer::new(Vec::new(), CancellationToken::new());
        assert!(w.hub_frame(frame(b"+OK\r\n")).await.is_err());
    }

    /// A stand-in for the hub's Redis: with `password`, every command but `AUTH`, `HELLO ...
    /// AUTH` and `RESET` gets `NOAUTH` until `AUTH` gives it; records the commands' names.
    async fn fake_hub(password: Option<&'static str>) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut authed = password.is_none();
                    let mut scanner = Scanner::new(Grammar::Command, Limits::default());
                    let mut buf = BytesMut::new();
                    while tcp.read_buf(&mut buf).await.is_ok_and(|n| n > 0) {
                        while let Ok(Some(f)) = scanner.scan(&buf) {
                            let req = Request::decode(buf.split_to(f.len).freeze()).expect("a command");
                            let name = req.name();
                            log.lock().expect("log").push(name.clone());
                            let pass = match name.as_str() {
                                "AUTH" => req.args().last().cloned(),
                                "HELLO" if req.args().len() >= 5 => req.args().get(4).cloned(),
                                _ => None,
                            };
                            let reply: &[u8] = match (name.as_str(), pass) {
                                (_, Some(p)) if password.is_some_and(|pw| p == pw.as_bytes()) => {
                                    authed = true;
                                    if name == "HELLO" { b"%1\r\n$5\r\nproto\r\n:2\r\n" } else { b"+OK\r\n" }
                                }
                                (_, Some(_)) => b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
                                ("RESET", _) => {
                                    authed = password.is_none();
                                    b"+RESET\r\n"
                                }
                                _ if !authed => b"-NOAUTH Authentication required.\r\n",
                                ("PING", _) => b"+PONG\r\n",
                                _ => b"+OK\r\n",
                            };
                            if tcp.write_all(reply).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    /// The proxy in front of the hub's Redis at `upstream`, serving one in-memory connection.
    fn proxy_connection(upstream: &str) -> tokio::io::DuplexStream {
        let kube =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().expect("uri"))).expect("client");
        let hub = Arc::new(crate::sync::hub::Hub::new(crate::PrincipalConfig::new("argocd"), "uid".into(), kube));
        let mut config = super::super::RedisProxyConfig::new(upstream);
        config.request_timeout = std::time::Duration::from_secs(5);
        let proxy = RedisProxy::new(hub, Arc::new(super::super::Exchange::default()), config, Arc::default());
        let (client, server) = tokio::io::duplex(64 << 10);
        tokio::spawn(serve(proxy, server, CancellationToken::new()));
        client
    }

    fn command(args: &[&[u8]]) -> Vec<u8> {
        Request::from_args(args.iter().map(|a| Bytes::copy_from_slice(a)).collect()).raw().to_vec()
    }

    /// The next `n` replies, or what came before the connection closed.
    async fn replies(client: &mut tokio::io::DuplexStream, n: usize) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut scanner = Scanner::new(Grammar::Reply, Limits::default());
        let (mut buf, mut out) = (BytesMut::new(), Vec::new());
        while out.len() < n {
            if let Some(f) = scanner.scan(&buf).expect("RESP") {
                out.push(String::from_utf8_lossy(&buf.split_to(f.len)).into_owned());
                continue;
            }
            match tokio::time::timeout_at(deadline, client.read_buf(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => break,
                Ok(Ok(_)) => {}
                Err(_) => panic!("no reply within 5 s; got {out:?} and {buf:?}"),
            }
        }
        out
    }

    /// Whether the proxy closed the connection (within 5 s).
    async fn closed(client: &mut tokio::io::DuplexStream) -> bool {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), client.read_to_end(&mut rest)).await;
        matches!(read, Ok(Ok(0)))
    }

    /// Before AUTH, Redis's bounds: a declared 500 MiB argument or 11 arguments are refused on
    /// the header with Redis's own error, the connection closed, nothing forwarded.
    #[tokio::test]
    async fn before_authentication_large_commands_are_refused_on_their_header() {
        let (hub, seen) = fake_hub(Some("pw")).await;
        let mut huge = command(&[b"SET", b"k"]);
        huge[1] = b'3';
        huge.extend_from_slice(b"$524288000\r\n");
        huge.extend_from_slice(&[b'x'; 32 << 10]);
        let mut client = proxy_connection(&hub);
        client.write_all(&huge).await.expect("write");
        assert_eq!(replies(&mut client, 1).await, ["-ERR Protocol error: unauthenticated bulk length\r\n"]);
        assert!(closed(&mut client).await, "closed after the error");

        let mut client = proxy_connection(&hub);
        client.write_all(b"*11\r\n").await.expect("write");
        assert_eq!(replies(&mut client, 1).await, ["-ERR Protocol error: unauthenticated multibulk length\r\n"]);
        assert!(closed(&mut client).await, "closed after the error");

        // A wrong password does not lift them.
        let mut client = proxy_connection(&hub);
        client.write_all(&command(&[b"AUTH", b"nope"])).await.expect("write");
        client.write_all(&command(&[b"SET", b"k", &[b'v'; 16385]])).await.expect("write");
        let got = replies(&mut client, 2).await;
        assert!(got[0].starts_with("-WRONGPASS"), "{got:?}");
        assert_eq!(got[1], "-ERR Protocol error: unauthenticated bulk length\r\n");
        assert!(!seen.lock().expect("log").iter().any(|c| c == "SET"), "nothing refused reached the hub");
    }

    /// Once the hub accepted AUTH (even pipelined with what follows) or HELLO ... AUTH, 11
    /// arguments and values over 16 KiB pass; after RESET, the bounds apply again.
    #[tokio::test]
    async fn authenticated_clients_may_send_more_and_larger_arguments() {
        let (hub, _) = fake_hub(Some("pw")).await;
        let eleven: Vec<&[u8]> = [&b"MSET"[..]].into_iter().chain(std::iter::repeat_n(&b"a"[..], 10)).collect();
        let mut client = proxy_connection(&hub);
        let mut pipelined = command(&[b"AUTH", b"pw"]);
        pipelined.extend(command(&eleven));
        pipelined.extend(command(&[b"SET", b"k", &[b'v'; 20 << 10]]));
        pipelined.extend(command(&[b"RESET"]));
        pipelined.extend(command(&eleven));
        client.write_all(&pipelined).await.expect("write");
        let got = replies(&mut client, 5).await;
        assert_eq!(
            got,
            [
                "+OK\r\n",
                "+OK\r\n",
                "+OK\r\n",
                "+RESET\r\n",
                "-ERR Protocol error: unauthenticated multibulk length\r\n"
            ]
        );

        let mut client = proxy_connection(&hub);
        client.write_all(&command(&[b"HELLO", b"2", b"AUTH", b"default", b"pw"])).await.expect("write");
        client.write_all(&command(&[b"SET", b"k", &[b'v'; 20 << 10]])).await.expect("write");
        assert_eq!(replies(&mut client, 2).await[1], "+OK\r\n");
    }

    /// With no password on the hub's Redis every client is authenticated from the start, as
    /// in Redis.
    #[tokio::test]
    async fn without_a_password_on_the_hub_every_client_is_authenticated() {
        let (hub, _) = fake_hub(None).await;
        let mut client = proxy_connection(&hub);
        client.write_all(&command(&[b"SET", b"k", &[b'v'; 20 << 10]])).await.expect("write");
        let eleven: Vec<&[u8]> = [&b"MSET"[..]].into_iter().chain(std::iter::repeat_n(&b"a"[..], 10)).collect();
        client.write_all(&command(&eleven)).await.expect("write");
        assert_eq!(replies(&mut client, 2).await, ["+OK\r\n", "+OK\r\n"]);
    }
}
