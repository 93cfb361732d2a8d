//! A consistency checker in the spirit of upstream's `hack/sync-consistency-util`: keeps a few
//! hundred Applications changing on their owner side while the link flaps and the principal,
//! the agents and the hub's API server are SIGKILLed and restarted, records every write and
//! everything the watches on both sides see, then checks that
//!
//! - every resource converges to the last write its owner's API server acknowledged (hub spec
//!   of managed Applications on the spoke; spoke status, and for autonomous Applications the
//!   spoke spec, on the hub) and no create or delete is lost;
//! - per resource and field, no older value overwrites a newer one on either side: the values a
//!   side observes follow the order they were written in (coalescing may skip values, never go
//!   back), checked per direction against the owner's write order only (the receiving side may
//!   legitimately lag; it must not regress), and no deleted Application comes back;
//! - and it measures the propagation delay (write acknowledged → first observation of that value,
//!   or a newer one, on the other side).
//!
//! Every written value is unique (`spec.source.path = "w-<n>"`, `status.sync.revision = "s-<n>"`,
//! `n` from one counter), so an observed value names the write it came from. A write counts only
//! if the API server acknowledged it; one whose answer was lost (the server was killed mid-way)
//! is resolved by reading the object back once the server answers again.
//!
//! The run itself is `tests/tests/consistency.rs` (the watches need `futures`, a dev-dependency);
//! the knobs are [`Config::from_env`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::faultproxy::{Direction, FaultControl};
use crate::fixtures::{application_resource, dynamic};
use crate::topology::{Mode, Topology};

/// The knobs of a run, from the environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// Applications kept on the managed agent (`CONSISTENCY_APPS`, default 200).
    pub apps: usize,
    /// Applications kept on the autonomous agent (`CONSISTENCY_AUTONOMOUS_APPS`, default a
    /// quarter of `apps`; 0: no autonomous agent).
    pub autonomous_apps: usize,
    /// How long the workload and the chaos run (`CONSISTENCY_DURATION`, seconds; default 90 in
    /// the per-change suite, 540 in the soak: [`crate::tier`]).
    pub duration: Duration,
    /// Deadline for convergence once the chaos stopped (`CONSISTENCY_CONVERGE`, seconds,
    /// default 120).
    pub converge: Duration,
    /// Seed of every random choice (`CONSISTENCY_SEED`, default from the clock; printed).
    pub seed: u64,
}

impl Config {
    /// Read the knobs from the environment.
    ///
    /// # Errors
    /// A variable is set but not a number.
    pub fn from_env() -> anyhow::Result<Self> {
        Self::from_env_or(crate::tier::size(Duration::from_secs(90), Duration::from_secs(540)))
    }

    /// [`Self::from_env`] with another default for `CONSISTENCY_DURATION`.
    ///
    /// # Errors
    /// A variable is set but is not a number.
    pub fn from_env_or(default_duration: Duration) -> anyhow::Result<Self> {
        fn var(name: &str) -> anyhow::Result<Option<u64>> {
            match std::env::var(name) {
                Ok(v) => Ok(Some(v.trim().parse().with_context(|| format!("{name}={v:?} is not a number"))?)),
                Err(_) => Ok(None),
            }
        }
        let apps = usize::try_from(var("CONSISTENCY_APPS")?.unwrap_or(200))?.max(1);
        let autonomous_apps = match var("CONSISTENCY_AUTONOMOUS_APPS")? {
            Some(n) => usize::try_from(n)?,
            None => (apps / 4).max(1),
        };
        let seed = match var("CONSISTENCY_SEED")? {
            Some(s) => s,
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| u64::try_from(d.as_nanos() % u128::from(u64::MAX)).unwrap_or(1)),
        };
        Ok(Self {
            apps,
            autonomous_apps,
            duration: var("CONSISTENCY_DURATION")?.map_or(default_duration, Duration::from_secs),
            converge: Duration::from_secs(var("CONSISTENCY_CONVERGE")?.unwrap_or(120)),
            seed,
        })
    }
}

/// A small deterministic generator (SplitMix64): the workload's random choices.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// Uniform in `lo..=hi`, in milliseconds.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = u64::try_from(hi.saturating_sub(lo).as_millis()).unwrap_or(u64::MAX - 1);
        lo + Duration::from_millis(self.below(span + 1))
    }

    /// An independent generator for another task.
    pub fn fork(&mut self) -> Self {
        Self::new(self.next_u64())
    }
}

/// Which cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// The hub (the principal's API server).
    Hub,
    /// The agent's spoke.
    Spoke,
}

impl Side {
    /// The other cluster.
    #[must_use]
    pub fn other(self) -> Self {
        match self {
            Self::Hub => Self::Spoke,
            Self::Spoke => Self::Hub,
        }
    }
}

/// The fields the workload writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    /// `spec.source.path` (`w-<n>`), also set by the create.
    Path,
    /// `status.sync.revision` (`s-<n>`).
    Revision,
}

impl Field {
    const ALL: [Self; 2] = [Self::Path, Self::Revision];

    /// The field's value in an object (`None`: absent).
    #[must_use]
    pub fn read(self, obj: &Value) -> Option<String> {
        let v = match self {
            Self::Path => &obj["spec"]["source"]["path"],
            Self::Revision => &obj["status"]["sync"]["revision"],
        };
        v.as_str().map(str::to_string)
    }
}

/// Where a field of an Application in `mode` is written: managed specs on the hub, everything
/// else on the spoke. Creates and deletes go with the spec.
#[must_use]
pub fn owner(mode: Mode, field: Field) -> Side {
    match (mode, field) {
        (Mode::Managed, Field::Path) => Side::Hub,
        _ => Side::Spoke,
    }
}

/// What became of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Sent, no answer yet.
    InFlight,
    /// The API server acknowledged it at this instant.
    Acked(Instant),
    /// The answer was lost, but reading the object back showed it applied.
    AppliedUnacked,
    /// The API server refused it, or reading back showed it was not applied.
    NotApplied,
    /// The answer was lost and the object could not be read back before the run ended.
    Unknown,
}

impl Outcome {
    fn applied(self) -> bool {
        matches!(self, Self::Acked(_) | Self::AppliedUnacked)
    }

    fn maybe(self) -> bool {
        matches!(self, Self::InFlight | Self::Unknown)
    }
}

#[derive(Debug)]
struct FieldWrite {
    value: String,
    sent: Instant,
    outcome: Outcome,
}

#[derive(Debug, Default)]
struct Seen {
    /// Highest write index observed (`None`: only "absent" so far).
    max: Option<usize>,
    /// Every change of the observed value, with when.
    history: Vec<(Instant, Option<usize>)>,
    observed: bool,
}

#[derive(Debug)]
struct Resource {
    agent: String,
    mode: Mode,
    create: Outcome,
    delete: Option<Outcome>,
    writes: BTreeMap<Field, Vec<FieldWrite>>,
    seen: BTreeMap<(Side, Field), Seen>,
    first_seen: BTreeMap<Side, Instant>,
    gone_seen: BTreeMap<Side, Instant>,
    delete_acked: Option<Instant>,
}

/// A consistency violation seen during the run or at the end.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Seconds since the checker started.
    pub at: f64,
    /// The Application.
    pub app: String,
    /// Where it was seen.
    pub side: Side,
    /// What is wrong.
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "t={:.3}s {} on the {:?}: {}", self.at, self.app, self.side, self.what)
    }
}

/// A handle on one write, to record its outcome.
#[derive(Debug, Clone)]
pub struct WriteId {
    app: String,
    kind: WriteKind,
}

#[derive(Debug, Clone, Copy)]
enum WriteKind {
    Create,
    Field(Field, usize),
    Delete,
}

#[derive(Debug, Default)]
struct Inner {
    resources: BTreeMap<String, Resource>,
    /// Value → (app, field, index in that field's writes).
    values: HashMap<String, (String, Field, usize)>,
    violations: Vec<Violation>,
    /// Per agent: Applications created and not (being) deleted, as far as the writer knows.
    live: BTreeMap<String, BTreeSet<String>>,
    events: u64,
    foreign: BTreeSet<String>,
    /// Per watch (agent, side), registered by [`Checker::watch_started`]: what it delivered.
    watches: BTreeMap<(String, Side), WatchStats>,
}

/// What one watch delivered during a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchStats {
    /// Events about the agent's Applications it delivered (creates, updates, deletes, relists).
    pub events: u64,
    /// Errors it reported (it relists or resumes after each: an error is not a failure, a watch
    /// that only errors is).
    pub errors: u64,
    /// The first error, for the report.
    pub first_error: Option<String>,
    /// The last error, for the report.
    pub last_error: Option<String>,
}

/// Records every write and observation of a run and checks them (see the module docs).
#[derive(Debug)]
pub struct Checker {
    start: Instant,
    seq: AtomicU64,
    inner: Mutex<Inner>,
}

impl Default for Checker {
    fn default() -> Self {
        Self::new()
    }
}

impl Checker {
    /// An empty record.
    #[must_use]
    pub fn new() -> Self {
        Self { start: Instant::now(), seq: AtomicU64::new(1), inner: Mutex::new(Inner::default()) }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A number never handed out before (for names and values).
    pub fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    fn since_start(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start).as_secs_f64()
    }

    /// Record a create of `app` on `agent`'s owner side with `spec.source.path = path`, about
    /// to be sent.
    pub fn begin_create(&self, agent: &str, mode: Mode, app: &str, path: &str) -> WriteId {
        let mut inner = self.inner();
        let mut writes = BTreeMap::new();
        writes.insert(
            Field::Path,
            vec![FieldWrite { value: path.to_string(), sent: Instant::now(), outcome: Outcome::InFlight }],
        );
        writes.insert(Field::Revision, Vec::new());
        inner.values.insert(path.to_string(), (app.to_string(), Field::Path, 0));
        inner.resources.insert(
            app.to_string(),
            Resource {
                agent: agent.to_string(),
                mode,
                create: Outcome::InFlight,
                delete: None,
                writes,
                seen: BTreeMap::new(),
                first_seen: BTreeMap::new(),
                gone_seen: BTreeMap::new(),
                delete_acked: None,
            },
        );
        WriteId { app: app.to_string(), kind: WriteKind::Create }
    }

    /// Record a write of `value` into `field` of `app`, about to be sent.
    ///
    /// # Errors
    /// `app` was never created.
    pub fn begin_write(&self, app: &str, field: Field, value: &str) -> anyhow::Result<WriteId> {
        let mut inner = self.inner();
        let res = inner.resources.get_mut(app).with_context(|| format!("no app {app}"))?;
        let writes = res.writes.entry(field).or_default();
        writes.push(FieldWrite { value: value.to_string(), sent: Instant::now(), outcome: Outcome::InFlight });
        let index = writes.len() - 1;
        inner.values.insert(value.to_string(), (app.to_string(), field, index));
        Ok(WriteId { app: app.to_string(), kind: WriteKind::Field(field, index) })
    }

    /// Record a delete of `app`, about to be sent (it stops being picked for writes).
    ///
    /// # Errors
    /// `app` was never created.
    pub fn begin_delete(&self, app: &str) -> anyhow::Result<WriteId> {
        let mut inner = self.inner();
        let res = inner.resources.get_mut(app).with_context(|| format!("no app {app}"))?;
        res.delete = Some(Outcome::InFlight);
        let agent = res.agent.clone();
        inner.live.entry(agent).or_default().remove(app);
        Ok(WriteId { app: app.to_string(), kind: WriteKind::Delete })
    }

    /// Record what became of a write.
    pub fn finish(&self, id: &WriteId, outcome: Outcome) {
        let mut inner = self.inner();
        let Some(res) = inner.resources.get_mut(&id.app) else { return };
        let agent = res.agent.clone();
        let mut live_change = None;
        match id.kind {
            WriteKind::Create => {
                res.create = outcome;
                if let Some(w) = res.writes.get_mut(&Field::Path).and_then(|w| w.first_mut()) {
                    w.outcome = outcome;
                }
                if outcome.applied() {
                    live_change = Some(true);
                }
            }
            WriteKind::Field(field, index) => {
                if let Some(w) = res.writes.get_mut(&field).and_then(|w| w.get_mut(index)) {
                    w.outcome = outcome;
                }
            }
            WriteKind::Delete => {
                res.delete = Some(outcome);
                if let Outcome::Acked(at) = outcome {
                    res.delete_acked = Some(at);
                }
                if outcome == Outcome::NotApplied {
                    // Still there: it can be written (and deleted) again.
                    res.delete = None;
                    live_change = Some(true);
                }
            }
        }
        if live_change == Some(true) {
            inner.live.entry(agent).or_default().insert(id.app.clone());
        }
    }

    /// How many Applications of `agent` are live.
    #[must_use]
    pub fn live_count(&self, agent: &str) -> usize {
        self.inner().live.get(agent).map_or(0, BTreeSet::len)
    }

    /// A random live Application of `agent`.
    pub fn pick_live(&self, agent: &str, rng: &mut Rng) -> Option<String> {
        let inner = self.inner();
        let live = inner.live.get(agent)?;
        let n = u64::try_from(live.len()).ok()?;
        live.iter().nth(usize::try_from(rng.below(n)).ok()?).cloned()
    }

    /// Register the watch of `agent`'s Applications on `side`: [`Report::blind_spots`] requires
    /// every registered watch to deliver events.
    pub fn watch_started(&self, agent: &str, side: Side) {
        self.inner().watches.entry((agent.to_string(), side)).or_default();
    }

    /// Record an error of the watch of `agent`'s Applications on `side` (e.g. while the hub's
    /// API server is down). Counted and reported; what fails a run is a watch that delivered
    /// nothing ([`Report::blind_spots`]).
    pub fn watch_error(&self, agent: &str, side: Side, error: &str) {
        let mut inner = self.inner();
        let stats = inner.watches.entry((agent.to_string(), side)).or_default();
        stats.errors += 1;
        if stats.first_error.is_none() {
            stats.first_error = Some(error.to_string());
        }
        stats.last_error = Some(error.to_string());
    }

    /// Record what a watch on `side` saw of Application `app`: its object, or `None` when it
    /// was deleted. Checks the order of values at once.
    pub fn observe(&self, side: Side, app: &str, obj: Option<&Value>) {
        let now = Instant::now();
        let at = self.since_start(now);
        let mut inner = self.inner();
        inner.events += 1;
        let Inner { resources, values, violations, foreign, watches, .. } = &mut *inner;
        if let Some(res) = resources.get(app) {
            watches.entry((res.agent.clone(), side)).or_default().events += 1;
        }
        let Some(res) = resources.get_mut(app) else {
            if obj.is_some() && foreign.insert(app.to_string()) {
                let what = "an Application the workload never created".to_string();
                violations.push(Violation { at, app: app.to_string(), side, what });
            }
            return;
        };
        let Some(obj) = obj else {
            res.gone_seen.entry(side).or_insert(now);
            return;
        };
        if res.gone_seen.contains_key(&side) {
            let what = "came back after its deletion was observed".to_string();
            violations.push(Violation { at, app: app.to_string(), side, what });
        }
        res.first_seen.entry(side).or_insert(now);
        for field in Field::ALL {
            let value = field.read(obj);
            let index = match &value {
                None => None,
                Some(v) => match values.get(v) {
                    Some((a, f, i)) if a == app && *f == field => Some(*i),
                    _ => {
                        let what = format!("{field:?} = {v:?}, a value never written to this field of this app");
                        violations.push(Violation { at, app: app.to_string(), side, what });
                        continue;
                    }
                },
            };
            let seen = res.seen.entry((side, field)).or_default();
            if seen.observed && index < seen.max {
                let newer = seen.max.and_then(|m| res.writes.get(&field).and_then(|w| w.get(m)));
                let what = format!(
                    "{field:?} went back to {} (write #{}) after {} (write #{}) had been seen",
                    value.as_deref().unwrap_or("<absent>"),
                    index.map_or_else(|| "-".to_string(), |i| i.to_string()),
                    newer.map_or("?", |w| w.value.as_str()),
                    seen.max.map_or_else(|| "-".to_string(), |i| i.to_string()),
                );
                violations.push(Violation { at, app: app.to_string(), side, what });
            }
            if !seen.observed || index > seen.max {
                seen.max = index;
            }
            if !seen.observed || seen.history.last().map(|h| h.1) != Some(index) {
                seen.history.push((now, index));
            }
            seen.observed = true;
        }
    }

    /// The value `side` saw last in `field` of `app` (`None`: nothing seen, or absent).
    #[must_use]
    pub fn last_seen(&self, app: &str, side: Side, field: Field) -> Option<String> {
        let inner = self.inner();
        let res = inner.resources.get(app)?;
        let index = res.seen.get(&(side, field))?.history.last()?.1?;
        Some(res.writes.get(&field)?.get(index)?.value.clone())
    }

    /// Violations recorded so far.
    #[must_use]
    pub fn violations(&self) -> Vec<Violation> {
        self.inner().violations.clone()
    }

    /// Record a violation found by a final check.
    pub fn violation(&self, app: &str, side: Side, what: String) {
        let at = self.since_start(Instant::now());
        self.inner().violations.push(Violation { at, app: app.to_string(), side, what });
    }

    /// Check the owner side's final state against the record: the Applications that exist are
    /// the ones created and not deleted, and each field holds the last applied write (or a
    /// later one whose outcome is unknown). Returns the mismatches.
    #[must_use]
    pub fn check_owner(&self, agent: &str, owner_state: &State) -> Vec<String> {
        let inner = self.inner();
        let mut out = Vec::new();
        for (app, res) in inner.resources.iter().filter(|(_, r)| r.agent == agent) {
            let exists = owner_state.get(app);
            let created = res.create;
            let deleted = res.delete.unwrap_or(Outcome::NotApplied);
            let must_exist = created.applied() && !deleted.applied() && !deleted.maybe();
            let must_not = (!created.applied() && !created.maybe()) || deleted.applied();
            if must_exist && exists.is_none() {
                out.push(format!("{app}: created (and not deleted) but missing on its owner side"));
            }
            if must_not && exists.is_some() {
                out.push(format!("{app}: exists on its owner side but was deleted or never created"));
            }
            let Some(actual) = exists else { continue };
            for field in Field::ALL {
                if owner(res.mode, field) != owner(res.mode, Field::Path) {
                    // Managed status lives on the spoke: see `check_spoke_status`.
                    continue;
                }
                if let Some(m) = expect_field(res, field, actual.get(field)) {
                    out.push(format!("{app}: {m}"));
                }
            }
        }
        out
    }

    /// Check the managed spoke's status (its owner side for `status`) against the record.
    #[must_use]
    pub fn check_spoke_status(&self, agent: &str, spoke_state: &State) -> Vec<String> {
        let inner = self.inner();
        let mut out = Vec::new();
        for (app, res) in inner.resources.iter().filter(|(_, r)| r.agent == agent) {
            if let Some(actual) = spoke_state.get(app)
                && let Some(m) = expect_field(res, Field::Revision, actual.get(Field::Revision))
            {
                out.push(format!("{app} (spoke): {m}"));
            }
        }
        out
    }

    /// Everything recorded about `app`: its writes with their outcomes, and what each side
    /// observed when (seconds since the start), for bug reports.
    #[must_use]
    pub fn describe(&self, app: &str) -> String {
        let inner = self.inner();
        let Some(res) = inner.resources.get(app) else { return format!("{app}: not in the record") };
        let mut out = format!(
            "{app} ({} agent {}): create {:?}, delete {:?}\n",
            mode_name(res.mode),
            res.agent,
            res.create,
            res.delete
        );
        for (field, writes) in &res.writes {
            let list: Vec<String> = writes
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    let o = match w.outcome {
                        Outcome::Acked(at) => format!("acked {:.3}", self.since_start(at)),
                        other => format!("{other:?}"),
                    };
                    format!("#{i} {} (sent {:.3}, {o})", w.value, self.since_start(w.sent))
                })
                .collect();
            let _ = writeln!(out, "  {field:?} writes: {}", list.join(", "));
        }
        for ((side, field), seen) in &res.seen {
            let list: Vec<String> = seen
                .history
                .iter()
                .map(|(at, i)| {
                    format!("{:.3}:{}", self.since_start(*at), i.map_or_else(|| "-".to_string(), |i| format!("#{i}")))
                })
                .collect();
            let _ = writeln!(out, "  {side:?} saw {field:?}: {}", list.join(" "));
        }
        for (side, at) in &res.gone_seen {
            let _ = writeln!(out, "  {side:?} saw it deleted at {:.3}", self.since_start(*at));
        }
        out
    }

    /// Counts and propagation delays.
    #[must_use]
    pub fn report(&self) -> Report {
        let inner = self.inner();
        let mut r = Report {
            events: inner.events,
            violations: inner.violations.len(),
            watches: inner.watches.iter().map(|((a, s), w)| (format!("{a} {}", side_name(*s)), w.clone())).collect(),
            ..Report::default()
        };
        for res in inner.resources.values() {
            let mode = res.mode;
            tally(&mut r.writes, mode, "create", res.create);
            if let Some(d) = res.delete {
                tally(&mut r.writes, mode, "delete", d);
            }
            for (field, writes) in &res.writes {
                let kind = match field {
                    Field::Path => "spec",
                    Field::Revision => "status",
                };
                let receiver = owner(mode, *field).other();
                let history = res.seen.get(&(receiver, *field)).map(|s| s.history.as_slice()).unwrap_or_default();
                // The highest write index the owner side's watch saw (its own writes, or newer).
                let owner_max = res.seen.get(&(owner(mode, *field), *field)).and_then(|s| s.max);
                let coverage = r.coverage.entry(direction(mode, *field)).or_default();
                let delays = r.delays.entry(direction(mode, *field)).or_default();
                for (i, w) in writes.iter().enumerate() {
                    if !(*field == Field::Path && i == 0) {
                        tally(&mut r.writes, mode, kind, w.outcome);
                    }
                    let Outcome::Acked(acked) = w.outcome else { continue };
                    coverage[0] += 1;
                    if owner_max.is_some_and(|m| m >= i) {
                        coverage[1] += 1;
                    }
                    match history.iter().find(|(_, j)| j.is_some_and(|j| j >= i)) {
                        Some((seen, _)) => delays.push(seen.saturating_duration_since(acked)),
                        None => *r.unobserved.entry(direction(mode, *field)).or_default() += 1,
                    }
                }
            }
            if let Some(acked) = res.delete_acked {
                let receiver = owner(mode, Field::Path).other();
                if let Some(gone) = res.gone_seen.get(&receiver) {
                    r.delays
                        .entry(format!("{} delete", mode_name(mode)))
                        .or_default()
                        .push(gone.saturating_duration_since(acked));
                }
            }
        }
        r
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Managed => "managed",
        Mode::Autonomous => "autonomous",
    }
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::Hub => "hub",
        Side::Spoke => "spoke",
    }
}

fn direction(mode: Mode, field: Field) -> String {
    let (what, from) = match field {
        Field::Path => ("spec", owner(mode, field)),
        Field::Revision => ("status", owner(mode, field)),
    };
    let arrow = match from {
        Side::Hub => "hub→spoke",
        Side::Spoke => "spoke→hub",
    };
    format!("{} {what} {arrow}", mode_name(mode))
}

fn tally(writes: &mut BTreeMap<String, [u64; 4]>, mode: Mode, kind: &str, outcome: Outcome) {
    let slot = match outcome {
        Outcome::Acked(_) => 0,
        Outcome::AppliedUnacked => 1,
        Outcome::NotApplied => 2,
        Outcome::InFlight | Outcome::Unknown => 3,
    };
    writes.entry(format!("{} {kind}", mode_name(mode))).or_default()[slot] += 1;
}

/// Whether `actual` is what the record says `field` must hold: the last applied write, or a
/// later write whose outcome is unknown. `Some(reason)` if not.
fn expect_field(res: &Resource, field: Field, actual: Option<&str>) -> Option<String> {
    let writes = res.writes.get(&field).map(Vec::as_slice).unwrap_or_default();
    let last = writes.iter().rposition(|w| w.outcome.applied());
    let mut allowed: Vec<Option<&str>> = vec![last.map(|i| writes[i].value.as_str())];
    let from = last.map_or(0, |i| i + 1);
    allowed.extend(writes[from..].iter().filter(|w| w.outcome.maybe()).map(|w| Some(w.value.as_str())));
    if allowed.contains(&actual) {
        return None;
    }
    Some(format!(
        "{field:?} is {} but the last applied write is {}",
        actual.unwrap_or("<absent>"),
        last.map_or("<none>", |i| writes[i].value.as_str())
    ))
}

/// Counts and delays of a run.
#[derive(Debug, Default)]
pub struct Report {
    /// Watch events observed.
    pub events: u64,
    /// Violations found.
    pub violations: usize,
    /// Per "mode kind": [acked, applied without ack, not applied, unknown].
    pub writes: BTreeMap<String, [u64; 4]>,
    /// Per direction: write ack → first observation on the other side.
    pub delays: BTreeMap<String, Vec<Duration>>,
    /// Per direction: acked writes never observed on the other side (their Application was
    /// deleted first).
    pub unobserved: BTreeMap<String, u64>,
    /// Per direction: [acked writes, of those seen (that value or a newer one) by the owner
    /// side's watch]. Seen on the receiving side: `delays[direction].len()`.
    pub coverage: BTreeMap<String, [u64; 2]>,
    /// Per watch ("<agent> <side>"): what it delivered.
    pub watches: BTreeMap<String, WatchStats>,
}

impl Report {
    /// Kinds of write ("managed status", ...) that were tried but never acknowledged: the
    /// workload did not exercise them (e.g. every write refused by the API server), so the run
    /// proves nothing about them.
    #[must_use]
    pub fn never_acked(&self) -> Vec<String> {
        self.writes.iter().filter(|(_, n)| n[0] == 0 && n.iter().sum::<u64>() > 0).map(|(k, _)| k.clone()).collect()
    }

    /// What the watches failed to see, so that the order and delay checks would pass vacuously:
    /// a registered watch that delivered no event about its agent's Applications (whatever
    /// errors it reported), and per direction with acked writes, a side (owner or receiver)
    /// whose watch saw none of them, or a receiving side that saw fewer than half of them
    /// (a write goes unobserved only when its Application is deleted before it arrives, and
    /// deletes are a few percent of the workload). Empty when the watches did their job.
    #[must_use]
    pub fn blind_spots(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (watch, w) in &self.watches {
            if w.events == 0 {
                let errors = match (&w.first_error, &w.last_error) {
                    (Some(first), Some(last)) => format!("{} errors, first: {first}; last: {last}", w.errors),
                    _ => "no error either".to_string(),
                };
                out.push(format!("the watch {watch} delivered no event about its Applications ({errors})"));
            }
        }
        for (dir, [acked, owner_seen]) in &self.coverage {
            if *acked == 0 {
                continue;
            }
            let receiver_seen = self.delays.get(dir).map_or(0, |d| u64::try_from(d.len()).unwrap_or(u64::MAX));
            if *owner_seen == 0 {
                out.push(format!("{dir}: none of {acked} acked writes was seen by the owner side's watch"));
            }
            if receiver_seen == 0 {
                out.push(format!("{dir}: none of {acked} acked writes was seen by the receiving side's watch"));
            } else if receiver_seen * 2 < *acked {
                out.push(format!(
                    "{dir}: only {receiver_seen} of {acked} acked writes were seen by the receiving side's watch"
                ));
            }
        }
        out
    }
}

/// The `q` quantile (0..=1) of `values` (sorted in place); zero when empty.
pub fn quantile(values: &mut [Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort_unstable();
    let last = values.len() - 1;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
    let i = ((last as f64) * q.clamp(0.0, 1.0)).round() as usize;
    values[i.min(last)]
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "writes (acked / applied, answer lost / not applied / unknown):")?;
        for (kind, [a, b, c, d]) in &self.writes {
            writeln!(f, "  {kind:<20} {a:>6} / {b} / {c} / {d}")?;
        }
        writeln!(f, "watch events observed: {}; violations: {}", self.events, self.violations)?;
        for (watch, w) in &self.watches {
            write!(f, "  watch {watch:<12} events={:<7} errors={}", w.events, w.errors)?;
            match &w.last_error {
                Some(e) => writeln!(f, " (last: {e})")?,
                None => writeln!(f)?,
            }
        }
        writeln!(f, "acked writes seen (that value or a newer one) by the owner / the receiving side's watch:")?;
        for (dir, [acked, owner_seen]) in &self.coverage {
            let receiver_seen = self.delays.get(dir).map_or(0, Vec::len);
            writeln!(f, "  {dir:<28} acked={acked:<6} owner={owner_seen:<6} receiver={receiver_seen}")?;
        }
        writeln!(f, "propagation delay (write ack → first observation on the other side, chaos included):")?;
        let mut all = Vec::new();
        for (dir, delays) in &self.delays {
            let mut d = delays.clone();
            all.extend_from_slice(delays);
            writeln!(
                f,
                "  {dir:<28} n={:<6} p50={:>7.1} ms  p99={:>8.1} ms  max={:>8.1} ms  (unobserved: {})",
                d.len(),
                ms(quantile(&mut d, 0.5)),
                ms(quantile(&mut d, 0.99)),
                ms(quantile(&mut d, 1.0)),
                self.unobserved.get(dir).copied().unwrap_or(0),
            )?;
        }
        writeln!(
            f,
            "  {:<28} n={:<6} p50={:>7.1} ms  p99={:>8.1} ms  max={:>8.1} ms",
            "all",
            all.len(),
            ms(quantile(&mut all, 0.5)),
            ms(quantile(&mut all, 0.99)),
            ms(quantile(&mut all, 1.0)),
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The fields of every Application in one namespace of one cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State(pub BTreeMap<String, AppFields>);

/// The written fields of one Application.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppFields {
    /// `spec.source.path`.
    pub path: Option<String>,
    /// `status.sync.revision`.
    pub revision: Option<String>,
}

impl AppFields {
    fn get(&self, field: Field) -> Option<&str> {
        match field {
            Field::Path => self.path.as_deref(),
            Field::Revision => self.revision.as_deref(),
        }
    }
}

impl State {
    /// List the Applications of `api`.
    ///
    /// # Errors
    /// The list fails.
    pub async fn list(api: &Api<DynamicObject>) -> anyhow::Result<Self> {
        let list = api.list(&kube::api::ListParams::default()).await?;
        Ok(Self(
            list.items
                .into_iter()
                .filter_map(|o| {
                    let name = o.metadata.name?;
                    let fields = AppFields { path: Field::Path.read(&o.data), revision: Field::Revision.read(&o.data) };
                    Some((name, fields))
                })
                .collect(),
        ))
    }

    fn get(&self, app: &str) -> Option<&AppFields> {
        self.0.get(app)
    }

    /// Differences between the owner side and the receiving side of one agent's Applications:
    /// names, the spec (`path`) and the status (`revision`). Empty when converged.
    #[must_use]
    pub fn diff(hub: &Self, spoke: &Self, limit: usize) -> Vec<String> {
        let names: BTreeSet<&String> = hub.0.keys().chain(spoke.0.keys()).collect();
        let mut out = Vec::new();
        for name in names {
            let line = match (hub.0.get(name), spoke.0.get(name)) {
                (Some(_), None) => format!("{name}: on the hub only"),
                (None, Some(_)) => format!("{name}: on the spoke only"),
                (Some(h), Some(s)) if h != s => format!("{name}: hub {h:?} / spoke {s:?}"),
                _ => continue,
            };
            out.push(line);
            if out.len() >= limit {
                break;
            }
        }
        out
    }
}

/// Cooperative stop signal for the workload and chaos tasks.
#[derive(Debug, Clone)]
pub struct Stop(watch::Receiver<bool>);

/// Raises a [`Stop`].
#[derive(Debug)]
pub struct StopHandle(watch::Sender<bool>);

impl StopHandle {
    /// A signal and its receivers.
    #[must_use]
    pub fn new() -> (Self, Stop) {
        let (tx, rx) = watch::channel(false);
        (Self(tx), Stop(rx))
    }

    /// Tell every receiver to stop.
    pub fn stop(&self) {
        self.0.send_replace(true);
    }
}

impl Stop {
    /// Whether the stop was raised.
    #[must_use]
    pub fn stopped(&self) -> bool {
        *self.0.borrow()
    }

    /// Pause for `d` (the workload's own pacing, not synchronisation); `false` if stopped.
    pub async fn pause(&mut self, d: Duration) -> bool {
        if self.stopped() {
            return false;
        }
        let slept = tokio::select! {
            () = tokio::time::sleep(d) => true,
            _ = self.0.wait_for(|s| *s) => false,
        };
        slept && !self.stopped()
    }
}

/// How a request ended.
enum Answer {
    Ok,
    /// The server refused it (4xx): not applied.
    Refused,
    /// No answer (connection refused or reset, 5xx): applied or not, read back to find out.
    Lost,
}

fn answer<T>(r: &Result<T, kube::Error>) -> Answer {
    match r {
        Ok(_) => Answer::Ok,
        Err(kube::Error::Api(s)) if s.code < 500 => Answer::Refused,
        Err(_) => Answer::Lost,
    }
}

/// One agent's Applications and the API the workload writes them through.
#[derive(Debug, Clone)]
pub struct Group {
    /// The agent's name.
    pub agent: String,
    /// Its mode.
    pub mode: Mode,
    /// Its Applications on the hub (namespace = agent name).
    pub hub: Api<DynamicObject>,
    /// Its Applications on the spoke.
    pub spoke: Api<DynamicObject>,
    /// The namespace on the side that creates them.
    pub owner_ns: String,
    /// How many Applications to keep.
    pub target: usize,
}

impl Group {
    /// One agent's Applications on `hub` (namespace = `agent`) and `spoke` (`spoke_ns`).
    #[must_use]
    pub fn new(agent: &str, mode: Mode, hub: kube::Client, spoke: kube::Client, spoke_ns: &str, target: usize) -> Self {
        let owner_ns = match mode {
            Mode::Managed => agent.to_string(),
            Mode::Autonomous => spoke_ns.to_string(),
        };
        Self {
            agent: agent.to_string(),
            mode,
            hub: Api::namespaced_with(hub, agent, &application_resource()),
            spoke: Api::namespaced_with(spoke, spoke_ns, &application_resource()),
            owner_ns,
            target,
        }
    }

    /// Where specs, creates and deletes are written.
    #[must_use]
    pub fn spec_api(&self) -> &Api<DynamicObject> {
        match self.mode {
            Mode::Managed => &self.hub,
            Mode::Autonomous => &self.spoke,
        }
    }

    /// The API of `side`.
    #[must_use]
    pub fn api(&self, side: Side) -> &Api<DynamicObject> {
        match side {
            Side::Hub => &self.hub,
            Side::Spoke => &self.spoke,
        }
    }

    /// Both sides' states now.
    ///
    /// # Errors
    /// A list fails.
    pub async fn states(&self) -> anyhow::Result<(State, State)> {
        Ok((State::list(&self.hub).await?, State::list(&self.spoke).await?))
    }
}

/// How long a writer keeps trying to read back an object whose write got no answer.
const RESOLVE_FOR: Duration = Duration::from_secs(90);

/// The workload's writers for one [`Group`].
#[derive(Debug)]
pub struct Writer {
    checker: Arc<Checker>,
    group: Group,
    rng: Rng,
    stop: Stop,
}

impl Writer {
    /// A writer of `group`'s Applications.
    #[must_use]
    pub fn new(checker: Arc<Checker>, group: Group, rng: Rng, stop: Stop) -> Self {
        Self { checker, group, rng, stop }
    }

    /// Create Applications until `target` are live (no pauses), before the chaos starts.
    ///
    /// # Errors
    /// A create fails.
    pub async fn populate(&mut self) -> anyhow::Result<()> {
        while self.checker.live_count(&self.group.agent) < self.group.target {
            if !self.create().await? {
                bail!("a create failed while populating {}", self.group.agent);
            }
        }
        Ok(())
    }

    /// Creates, updates (`spec.source.path`) and deletes on the owner side, paced at random
    /// in `pause`, keeping about `target` Applications, until stopped.
    ///
    /// # Errors
    /// The record is inconsistent (a bug in the checker).
    pub async fn run_spec(mut self, pause: (Duration, Duration)) -> anyhow::Result<()> {
        loop {
            let d = self.rng.between(pause.0, pause.1);
            if !self.stop.pause(d).await {
                return Ok(());
            }
            let live = self.checker.live_count(&self.group.agent);
            let target = self.group.target;
            let (create, delete) = if live * 100 < target * 95 {
                (60, 2)
            } else if live * 100 > target * 105 {
                (2, 60)
            } else {
                (7, 7)
            };
            let roll = self.rng.below(100);
            let ok = if roll < create {
                self.create().await?
            } else if roll < create + delete {
                self.delete().await?
            } else {
                self.update(Field::Path).await?
            };
            if !ok {
                // The API server is probably down: do not spin.
                let d = self.rng.between(Duration::from_millis(200), Duration::from_millis(500));
                self.stop.pause(d).await;
            }
        }
    }

    /// Status writes (`status.sync.revision`) on the spoke, paced at random in `pause`, until
    /// stopped.
    ///
    /// # Errors
    /// The record is inconsistent (a bug in the checker).
    pub async fn run_status(mut self, pause: (Duration, Duration)) -> anyhow::Result<()> {
        loop {
            let d = self.rng.between(pause.0, pause.1);
            if !self.stop.pause(d).await {
                return Ok(());
            }
            if !self.update(Field::Revision).await? {
                let d = self.rng.between(Duration::from_millis(200), Duration::from_millis(500));
                self.stop.pause(d).await;
            }
        }
    }

    fn field_api(&self, field: Field) -> &Api<DynamicObject> {
        self.group.api(owner(self.group.mode, field))
    }

    async fn create(&mut self) -> anyhow::Result<bool> {
        let n = self.checker.next();
        let name = format!("{}-{n}", self.group.agent);
        let path = format!("w-{}", self.checker.next());
        let obj = dynamic(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": name, "namespace": self.group.owner_ns, "labels": {"consistency": "yes"}},
            "spec": {
                "project": "default",
                "source": {"repoURL": "https://example.com/consistency.git", "path": path, "targetRevision": "HEAD"},
                "destination": {"server": "https://kubernetes.default.svc", "namespace": name},
            },
        }))?;
        let id = self.checker.begin_create(&self.group.agent, self.group.mode, &name, &path);
        let r = self.group.spec_api().create(&PostParams::default(), &obj).await;
        self.settle(&id, &name, answer(&r), |o| {
            o.is_some_and(|o| Field::Path.read(o).as_deref() == Some(path.as_str()))
        })
        .await
    }

    async fn update(&mut self, field: Field) -> anyhow::Result<bool> {
        let Some(name) = self.checker.pick_live(&self.group.agent, &mut self.rng) else { return Ok(true) };
        let value = match field {
            Field::Path => format!("w-{}", self.checker.next()),
            Field::Revision => format!("s-{}", self.checker.next()),
        };
        let patch = match field {
            Field::Path => json!({"spec": {"source": {"path": value}}}),
            // `status` is required in `status.sync` by Argo CD's CRD: a real API server refuses
            // the patch without it (422), the embedded one does not check.
            Field::Revision => json!({"status": {"sync": {"status": "Synced", "revision": value}}}),
        };
        let id = self.checker.begin_write(&name, field, &value)?;
        let r = self.field_api(field).patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await;
        let a = answer(&r);
        self.settle(&id, &name, a, |o| o.is_some_and(|o| field.read(o).as_deref() == Some(value.as_str()))).await
    }

    async fn delete(&mut self) -> anyhow::Result<bool> {
        let Some(name) = self.checker.pick_live(&self.group.agent, &mut self.rng) else { return Ok(true) };
        let id = self.checker.begin_delete(&name)?;
        let r = self.group.spec_api().delete(&name, &DeleteParams::default()).await;
        self.settle(&id, &name, answer(&r), |o| o.is_none_or(|o| !o["metadata"]["deletionTimestamp"].is_null())).await
    }

    /// Record the outcome of a write; if its answer was lost, read the object back (retrying
    /// while its API server is down) and decide with `applied`. `true` if it was answered.
    async fn settle(
        &mut self,
        id: &WriteId,
        name: &str,
        answer: Answer,
        applied: impl Fn(Option<&Value>) -> bool,
    ) -> anyhow::Result<bool> {
        match answer {
            Answer::Ok => {
                self.checker.finish(id, Outcome::Acked(Instant::now()));
                return Ok(true);
            }
            Answer::Refused => {
                self.checker.finish(id, Outcome::NotApplied);
                return Ok(true);
            }
            Answer::Lost => {}
        }
        let api = match id.kind {
            WriteKind::Field(field, _) => self.field_api(field).clone(),
            WriteKind::Create | WriteKind::Delete => self.group.spec_api().clone(),
        };
        let outcome = resolve(&api, name, &applied).await;
        self.checker.finish(id, outcome);
        Ok(false)
    }
}

/// Read `name` back until its API server answers (up to [`RESOLVE_FOR`]) and decide.
async fn resolve(api: &Api<DynamicObject>, name: &str, applied: &impl Fn(Option<&Value>) -> bool) -> Outcome {
    let deadline = Instant::now() + RESOLVE_FOR;
    let mut backoff = Duration::from_millis(50);
    loop {
        if let Ok(o) = api.get_opt(name).await {
            let v = o.map(|o| serde_json::to_value(o).unwrap_or_default());
            return if applied(v.as_ref()) { Outcome::AppliedUnacked } else { Outcome::NotApplied };
        }
        if Instant::now() >= deadline {
            return Outcome::Unknown;
        }
        // Retrying a request against a server that is down: a backoff, not synchronisation.
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

/// Counts of the link faults injected.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinkChaos {
    /// Black holes.
    pub blackholes: u64,
    /// Resets (every connection reset, new ones refused for a while).
    pub resets: u64,
    /// Latency spells.
    pub latencies: u64,
}

/// Flap the link through `proxy` until stopped: every 2–5 s one of a black hole (1–4 s), a reset
/// with new connections refused (0.5–2.5 s), or 50–400 ms of latency each way (3–8 s). Leaves
/// the link clear.
pub async fn link_chaos(proxy: FaultControl, mut rng: Rng, mut stop: Stop) -> LinkChaos {
    let mut n = LinkChaos::default();
    let between = |rng: &mut Rng, lo: u64, hi: u64| rng.between(Duration::from_millis(lo), Duration::from_millis(hi));
    loop {
        let healthy = between(&mut rng, 2000, 5000);
        if !stop.pause(healthy).await {
            break;
        }
        let down = match rng.below(3) {
            0 => {
                n.blackholes += 1;
                proxy.blackhole(true);
                between(&mut rng, 1000, 4000)
            }
            1 => {
                n.resets += 1;
                proxy.refuse(true);
                proxy.reset_all();
                between(&mut rng, 500, 2500)
            }
            _ => {
                n.latencies += 1;
                let latency = between(&mut rng, 50, 400);
                proxy.set_latency(Direction::Both, latency);
                between(&mut rng, 3000, 8000)
            }
        };
        // The fault's duration is the chaos itself, not synchronisation.
        let go_on = stop.pause(down).await;
        proxy.clear();
        if !go_on {
            break;
        }
    }
    proxy.clear();
    n
}

/// A process the chaos kills and restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The principal.
    Principal,
    /// An agent, by name.
    Agent(String),
    /// The hub's embedded API server.
    Hub,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Principal => f.write_str("principal"),
            Self::Agent(a) => write!(f, "agent {a}"),
            Self::Hub => f.write_str("hub API server"),
        }
    }
}

/// SIGKILL `target`, keep it down for `down` (the chaos), start it again.
///
/// # Errors
/// It cannot be killed or does not come back.
pub async fn kill_and_restart(t: &mut Topology, target: &Target, down: Duration) -> anyhow::Result<()> {
    match target {
        Target::Principal => t.kill_principal()?,
        Target::Agent(a) => t.kill_agent(a)?,
        Target::Hub => t.kill_hub()?,
    }
    tokio::time::sleep(down).await;
    match target {
        Target::Principal => t.start_principal().await,
        Target::Agent(a) => t.start_agent(a).await,
        Target::Hub => t.restart_hub().await,
    }
    .with_context(|| format!("restarting the {target}"))
}

/// Kill and restart the principal, each agent and the hub's API server in turn, evenly over
/// `duration` (each at least once), each down for 1–5 s. Returns what happened, with times.
///
/// # Errors
/// A process does not come back.
pub async fn process_chaos(
    t: &mut Topology,
    agents: &[String],
    rng: &mut Rng,
    duration: Duration,
    log: &mut Vec<String>,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let end = start + duration;
    let mut targets = vec![Target::Principal];
    for (i, a) in agents.iter().enumerate() {
        targets.push(Target::Agent(a.clone()));
        if i == 0 {
            targets.push(Target::Hub);
        }
    }
    let slots = u32::try_from(targets.len() + 2).unwrap_or(u32::MAX);
    let interval = (duration / slots).min(Duration::from_secs(30));
    for (round, target) in targets.iter().cycle().enumerate() {
        let wait = rng.between(interval * 4 / 5, interval * 6 / 5);
        let down = rng.between(Duration::from_secs(1), Duration::from_secs(5));
        // Each process at least once, even if a short run overruns a little.
        if round >= targets.len() && Instant::now() + wait + down >= end {
            break;
        }
        // The schedule is the chaos, not synchronisation.
        tokio::time::sleep(wait).await;
        let at = start.elapsed().as_secs_f64();
        kill_and_restart(t, target, down).await?;
        log.push(format!("t={at:>6.1}s SIGKILL {target}, down {:.1} s", down.as_secs_f64()));
    }
    // Whatever is left of the run, the link chaos keeps going.
    tokio::time::sleep(end.saturating_duration_since(Instant::now())).await;
    Ok(())
}

/// Poll both sides of every group until they agree (see [`State::diff`]) or `timeout` passes.
/// Returns how long it took.
///
/// # Errors
/// They still differ at the deadline (the error lists the differences).
pub async fn wait_converged(groups: &[Group], timeout: Duration) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut poll = crate::wait::Poller::new(timeout, "both sides of every agent to converge");
    loop {
        let mut diffs = Vec::new();
        for g in groups {
            match g.states().await {
                Ok((hub, spoke)) => {
                    diffs.extend(State::diff(&hub, &spoke, 20).into_iter().map(|d| format!("{}: {d}", g.agent)));
                }
                Err(e) => diffs.push(format!("{}: cannot list: {e:#}", g.agent)),
            }
        }
        if diffs.is_empty() {
            return Ok(start.elapsed());
        }
        if let Err(e) = poll.tick().await {
            let mut msg = String::new();
            for d in diffs.iter().take(40) {
                let _ = writeln!(msg, "  {d}");
            }
            return Err(e.context(format!("{} differences, e.g.:\n{msg}", diffs.len())));
        }
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    fn app(path: &str, revision: Option<&str>) -> Value {
        json!({"spec": {"source": {"path": path}}, "status": {"sync": {"revision": revision}}})
    }

    #[test]
    fn coalescing_is_fine_going_back_is_not() {
        let c = Checker::new();
        let id = c.begin_create("m", Mode::Managed, "a", "w-1");
        c.finish(&id, Outcome::Acked(Instant::now()));
        for v in ["w-2", "w-3", "w-4"] {
            let id = c.begin_write("a", Field::Path, v).unwrap();
            c.finish(&id, Outcome::Acked(Instant::now()));
        }
        c.observe(Side::Spoke, "a", Some(&app("w-1", None)));
        c.observe(Side::Spoke, "a", Some(&app("w-3", None)));
        c.observe(Side::Spoke, "a", Some(&app("w-3", None)));
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        c.observe(Side::Spoke, "a", Some(&app("w-2", None)));
        assert_eq!(c.violations().len(), 1);
        // The hub side is tracked on its own.
        c.observe(Side::Hub, "a", Some(&app("w-2", None)));
        assert_eq!(c.violations().len(), 1);
    }

    #[test]
    fn status_cleared_foreign_values_and_resurrection_are_violations() {
        let c = Checker::new();
        let id = c.begin_create("m", Mode::Managed, "a", "w-1");
        c.finish(&id, Outcome::Acked(Instant::now()));
        let id = c.begin_write("a", Field::Revision, "s-2").unwrap();
        c.finish(&id, Outcome::Acked(Instant::now()));
        c.observe(Side::Hub, "a", Some(&app("w-1", None)));
        c.observe(Side::Hub, "a", Some(&app("w-1", Some("s-2"))));
        assert!(c.violations().is_empty());
        c.observe(Side::Hub, "a", Some(&app("w-1", None)));
        c.observe(Side::Hub, "a", Some(&app("w-9", Some("s-2"))));
        c.observe(Side::Hub, "a", None);
        c.observe(Side::Hub, "a", Some(&app("w-1", Some("s-2"))));
        c.observe(Side::Hub, "zz", Some(&app("w-1", None)));
        assert_eq!(c.violations().len(), 4, "{:#?}", c.violations());
    }

    #[test]
    fn owner_state_must_hold_the_last_applied_write() {
        let c = Checker::new();
        let id = c.begin_create("m", Mode::Managed, "a", "w-1");
        c.finish(&id, Outcome::Acked(Instant::now()));
        let id = c.begin_write("a", Field::Path, "w-2").unwrap();
        c.finish(&id, Outcome::AppliedUnacked);
        let id = c.begin_write("a", Field::Path, "w-3").unwrap();
        c.finish(&id, Outcome::NotApplied);
        let id = c.begin_write("a", Field::Path, "w-4").unwrap();
        c.finish(&id, Outcome::Unknown);
        let state = |p: &str| {
            State([("a".to_string(), AppFields { path: Some(p.into()), revision: None })].into_iter().collect())
        };
        assert!(c.check_owner("m", &state("w-2")).is_empty());
        assert!(c.check_owner("m", &state("w-4")).is_empty());
        assert_eq!(c.check_owner("m", &state("w-3")).len(), 1);
        assert_eq!(c.check_owner("m", &State::default()).len(), 1);
        let id = c.begin_delete("a").unwrap();
        c.finish(&id, Outcome::Acked(Instant::now()));
        assert!(c.check_owner("m", &State::default()).is_empty());
        assert_eq!(c.check_owner("m", &state("w-2")).len(), 1);
    }

    #[test]
    fn delays_count_the_first_observation_of_the_value_or_a_newer_one() {
        let c = Checker::new();
        let id = c.begin_create("m", Mode::Managed, "a", "w-1");
        c.finish(&id, Outcome::Acked(Instant::now()));
        let id = c.begin_write("a", Field::Path, "w-2").unwrap();
        c.finish(&id, Outcome::Acked(Instant::now()));
        c.observe(Side::Spoke, "a", Some(&app("w-2", None)));
        let r = c.report();
        assert_eq!(r.delays["managed spec hub→spoke"].len(), 2);
        assert_eq!(r.writes["managed create"][0], 1);
        assert_eq!(r.writes["managed spec"][0], 1);
    }

    #[test]
    fn a_checker_that_saw_nothing_reports_blind_spots() {
        let c = Checker::new();
        c.watch_started("m", Side::Hub);
        c.watch_started("m", Side::Spoke);
        let id = c.begin_create("m", Mode::Managed, "a", "w-1");
        c.finish(&id, Outcome::Acked(Instant::now()));
        let id = c.begin_write("a", Field::Revision, "s-2").unwrap();
        c.finish(&id, Outcome::Acked(Instant::now()));
        c.watch_error("m", Side::Spoke, "connection refused");
        let blind = c.report().blind_spots();
        let all = blind.join("\n");
        for expected in [
            "the watch m hub delivered no event about its Applications (no error either)",
            "the watch m spoke delivered no event about its Applications (1 errors, first: connection refused",
            "managed spec hub→spoke: none of 1 acked writes was seen by the owner side's watch",
            "managed spec hub→spoke: none of 1 acked writes was seen by the receiving side's watch",
            "managed status spoke→hub: none of 1 acked writes was seen by the owner side's watch",
            "managed status spoke→hub: none of 1 acked writes was seen by the receiving side's watch",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        assert_eq!(blind.len(), 6, "{all}");

        // Both sides see the (latest) values: nothing is missing, errors or not.
        for side in [Side::Hub, Side::Spoke] {
            c.observe(side, "a", Some(&app("w-1", Some("s-2"))));
        }
        assert!(c.report().blind_spots().is_empty(), "{:?}", c.report().blind_spots());
        assert_eq!(c.report().watches["m spoke"].errors, 1);

        // A receiving side that saw fewer than half of the acked writes is a blind spot too.
        for v in ["w-3", "w-4", "w-5"] {
            let id = c.begin_write("a", Field::Path, v).unwrap();
            c.finish(&id, Outcome::Acked(Instant::now()));
        }
        c.observe(Side::Hub, "a", Some(&app("w-5", Some("s-2"))));
        assert_eq!(
            c.report().blind_spots(),
            ["managed spec hub→spoke: only 1 of 4 acked writes were seen by the receiving side's watch"]
        );
    }

    #[test]
    fn quantiles_and_rng() {
        let mut v: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(quantile(&mut v, 0.5), Duration::from_millis(51));
        assert_eq!(quantile(&mut v, 1.0), Duration::from_millis(100));
        assert_eq!(quantile(&mut [], 0.5), Duration::ZERO);
        let mut r = Rng::new(7);
        let d = r.between(Duration::from_millis(10), Duration::from_millis(20));
        assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(20));
        assert_eq!(Rng::new(3).next_u64(), Rng::new(3).next_u64());
    }
}
