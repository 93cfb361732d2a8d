//! The Prometheus text exposition format 0.0.4 (what `promtool check metrics` accepts), shared
//! by the principal's and the agent's metrics: labelled counters and histograms whose series
//! appear on first use, and the line writers. Label values from the wire go through
//! [`resource_type`] and [`event_type`], never verbatim.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::event::{EventType, Target};

/// Prometheus client's default histogram buckets, in seconds.
pub const DEFAULT_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A series' label values in label order, joined by NUL in one allocation (a `Vec<String>` of
/// them cost four, and most of a per-agent series' memory on a principal holding thousands of
/// idle agents). No label value keeps a NUL: one is replaced by U+FFFD.
type SeriesKey = Box<str>;

const SEPARATOR: char = '\0';

fn series_key(values: &[&str]) -> String {
    let mut key = String::with_capacity(values.iter().map(|v| v.len() + 1).sum::<usize>().saturating_sub(1));
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            key.push(SEPARATOR);
        }
        if v.contains(SEPARATOR) {
            key.push_str(&v.replace(SEPARATOR, "\u{FFFD}"));
        } else {
            key.push_str(v);
        }
    }
    key
}

/// The label values of a series key, in label order.
fn label_values(key: &str) -> Vec<&str> {
    key.split(SEPARATOR).collect()
}

/// Whether the series `key` has `value` at label position `i`.
fn has_value(key: &str, i: usize, value: &str) -> bool {
    key.split(SEPARATOR).nth(i) == Some(value)
}

/// The label value for an event's target (`resource_type`): its wire name, or `unknown`
/// (values from the wire are not trusted as label values).
#[must_use]
pub fn resource_type(target: &Target) -> &str {
    if target.is_known() { target.as_str() } else { "unknown" }
}

/// The label value for an event's type: the suffix (`create`, `spec-update`, ...), or `unknown`.
#[must_use]
pub fn event_type(ty: &EventType) -> &str {
    match ty.suffix() {
        Some(s) if ty.is_known() => s,
        _ if ty.is_known() => ty.as_str(),
        _ => "unknown",
    }
}

/// A counter with labels; series appear on first increment.
#[derive(Debug)]
pub struct CounterVec {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    values: Mutex<BTreeMap<SeriesKey, u64>>,
}

impl CounterVec {
    /// A counter named `name` with `labels`.
    #[must_use]
    pub fn new(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Self {
        Self { name, help, labels, values: Mutex::new(BTreeMap::new()) }
    }

    /// Adds one to the series `values` (in label order).
    pub fn inc(&self, values: &[&str]) {
        let key = series_key(values);
        let mut all = lock(&self.values);
        match all.get_mut(key.as_str()) {
            Some(n) => *n += 1,
            None => _ = all.insert(key.into_boxed_str(), 1),
        }
    }

    /// Removes every series whose `label` is `value`.
    pub fn remove(&self, label: &str, value: &str) {
        if let Some(i) = self.labels.iter().position(|l| *l == label) {
            lock(&self.values).retain(|k, _| !has_value(k, i, value));
        }
    }

    /// Appends the metric in the text format (nothing without series).
    pub fn encode(&self, out: &mut String) {
        let values = lock(&self.values);
        if values.is_empty() {
            return;
        }
        header(out, self.name, "counter", self.help);
        for (key, v) in values.iter() {
            sample(out, self.name, self.labels, &label_values(key), None, &v.to_string());
        }
    }
}

/// A histogram with labels; series appear on first observation.
#[derive(Debug)]
pub struct HistogramVec {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    buckets: &'static [f64],
    values: Mutex<BTreeMap<SeriesKey, Histogram>>,
}

#[derive(Debug, Default, Clone)]
struct Histogram {
    /// Per bucket (not cumulative); observations above the last bucket only count in `count`.
    counts: Box<[u64]>,
    sum: f64,
    count: u64,
}

impl HistogramVec {
    /// A histogram named `name` with `labels` and upper bounds `buckets`.
    #[must_use]
    pub fn new(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        buckets: &'static [f64],
    ) -> Self {
        Self { name, help, labels, buckets, values: Mutex::new(BTreeMap::new()) }
    }

    /// Records `v` in the series `values` (in label order).
    pub fn observe(&self, values: &[&str], v: f64) {
        let key = series_key(values).into_boxed_str();
        let mut all = lock(&self.values);
        let h = all.entry(key).or_insert_with(|| Histogram {
            counts: vec![0; self.buckets.len()].into_boxed_slice(),
            ..Histogram::default()
        });
        if let Some(i) = self.buckets.iter().position(|b| v <= *b) {
            h.counts[i] += 1;
        }
        h.sum += v;
        h.count += 1;
    }

    /// Removes every series whose `label` is `value`.
    pub fn remove(&self, label: &str, value: &str) {
        if let Some(i) = self.labels.iter().position(|l| *l == label) {
            lock(&self.values).retain(|k, _| !has_value(k, i, value));
        }
    }

    /// Appends the metric in the text format (nothing without series).
    pub fn encode(&self, out: &mut String) {
        let values = lock(&self.values);
        if values.is_empty() {
            return;
        }
        header(out, self.name, "histogram", self.help);
        let bucket = format!("{}_bucket", self.name);
        for (key, h) in values.iter() {
            let key = &label_values(key)[..];
            let mut cumulative = 0;
            for (b, n) in self.buckets.iter().zip(&h.counts) {
                cumulative += n;
                sample(out, &bucket, self.labels, key, Some(&b.to_string()), &cumulative.to_string());
            }
            sample(out, &bucket, self.labels, key, Some("+Inf"), &h.count.to_string());
            sample(out, &format!("{}_sum", self.name), self.labels, key, None, &h.sum.to_string());
            sample(out, &format!("{}_count", self.name), self.labels, key, None, &h.count.to_string());
        }
    }
}

/// `# HELP` and `# TYPE` lines.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value escaped for the text format.
#[must_use]
pub fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One sample line: `name{labels,le="..."} value`.
pub fn sample(out: &mut String, name: &str, labels: &[&str], values: &[&str], le: Option<&str>, value: &str) {
    out.push_str(name);
    let mut pairs: Vec<String> =
        labels.iter().zip(values).map(|(l, v)| format!("{l}=\"{}\"", escape_label(v))).collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if !pairs.is_empty() {
        let _ = write!(out, "{{{}}}", pairs.join(","));
    }
    let _ = writeln!(out, " {value}");
}

/// An unlabelled metric.
pub fn single(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    header(out, name, kind, help);
    sample(out, name, &[], &[], None, &value.to_string());
}

/// A gauge with one sample per label set (omitted when there is none).
pub fn gauge(out: &mut String, name: &str, help: &str, labels: &[&[(&str, &str)]], values: &[f64]) {
    if labels.is_empty() {
        return;
    }
    header(out, name, "gauge", help);
    for (set, v) in labels.iter().zip(values) {
        let names: Vec<&str> = set.iter().map(|(n, _)| *n).collect();
        let vals: Vec<&str> = set.iter().map(|(_, v)| *v).collect();
        sample(out, name, &names, &vals, None, &v.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counters_series_are_kept_by_their_label_values_and_removed_by_one_of_them() {
        let c = CounterVec::new("x_total", "X.", &["agent_name", "reason"]);
        c.inc(&["agent-1", "a"]);
        c.inc(&["agent-1", "a"]);
        c.inc(&["agent-1", "b"]);
        c.inc(&["agent-2", "a"]);
        let mut out = String::new();
        c.encode(&mut out);
        assert_eq!(
            out,
            "# HELP x_total X.\n# TYPE x_total counter\n\
             x_total{agent_name=\"agent-1\",reason=\"a\"} 2\n\
             x_total{agent_name=\"agent-1\",reason=\"b\"} 1\n\
             x_total{agent_name=\"agent-2\",reason=\"a\"} 1\n"
        );
        c.remove("reason", "a");
        let mut out = String::new();
        c.encode(&mut out);
        assert!(out.ends_with("# TYPE x_total counter\nx_total{agent_name=\"agent-1\",reason=\"b\"} 1\n"), "{out}");
        c.remove("agent_name", "agent-1");
        let mut out = String::new();
        c.encode(&mut out);
        assert!(out.is_empty(), "no series, no header: {out}");
    }

    #[test]
    fn a_label_value_with_a_nul_stays_one_value() {
        let c = CounterVec::new("x_total", "X.", &["a", "b"]);
        c.inc(&["one\0two", "three"]);
        c.inc(&["", ""]);
        let mut out = String::new();
        c.encode(&mut out);
        assert!(out.contains("x_total{a=\"\",b=\"\"} 1\n"), "{out}");
        assert!(out.contains("x_total{a=\"one\u{FFFD}two\",b=\"three\"} 1\n"), "{out}");
        c.remove("b", "three");
        let mut out = String::new();
        c.encode(&mut out);
        assert!(!out.contains("three"), "{out}");
    }

    #[test]
    fn a_histogram_counts_each_observation_in_its_bucket_and_encodes_them_cumulatively() {
        let h = HistogramVec::new("t_seconds", "T.", &["agent_name"], &[0.1, 1.0]);
        h.observe(&["agent-1"], 0.05);
        h.observe(&["agent-1"], 0.5);
        h.observe(&["agent-1"], 5.0);
        h.observe(&["agent-2"], 0.5);
        let mut out = String::new();
        h.encode(&mut out);
        for line in [
            "t_seconds_bucket{agent_name=\"agent-1\",le=\"0.1\"} 1\n",
            "t_seconds_bucket{agent_name=\"agent-1\",le=\"1\"} 2\n",
            "t_seconds_bucket{agent_name=\"agent-1\",le=\"+Inf\"} 3\n",
            "t_seconds_sum{agent_name=\"agent-1\"} 5.55\n",
            "t_seconds_count{agent_name=\"agent-1\"} 3\n",
            "t_seconds_bucket{agent_name=\"agent-2\",le=\"1\"} 1\n",
        ] {
            assert!(out.contains(line), "{line:?} in {out}");
        }
        h.remove("agent_name", "agent-1");
        let mut out = String::new();
        h.encode(&mut out);
        assert!(!out.contains("agent-1") && out.contains("agent-2"), "{out}");
    }
}
