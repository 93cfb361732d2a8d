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
    values: Mutex<BTreeMap<Vec<String>, u64>>,
}

impl CounterVec {
    /// A counter named `name` with `labels`.
    #[must_use]
    pub fn new(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Self {
        Self { name, help, labels, values: Mutex::new(BTreeMap::new()) }
    }

    /// Adds one to the series `values` (in label order).
    pub fn inc(&self, values: &[&str]) {
        let key = values.iter().map(|v| (*v).to_owned()).collect();
        *lock(&self.values).entry(key).or_default() += 1;
    }

    /// Removes every series whose `label` is `value`.
    pub fn remove(&self, label: &str, value: &str) {
        if let Some(i) = self.labels.iter().position(|l| *l == label) {
            lock(&self.values).retain(|k, _| k.get(i).map(String::as_str) != Some(value));
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
            sample(out, self.name, self.labels, key, None, &v.to_string());
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
    values: Mutex<BTreeMap<Vec<String>, Histogram>>,
}

#[derive(Debug, Default, Clone)]
struct Histogram {
    /// Per bucket (not cumulative); observations above the last bucket only count in `count`.
    counts: Vec<u64>,
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
        let key = values.iter().map(|v| (*v).to_owned()).collect();
        let mut all = lock(&self.values);
        let h: &mut Histogram = all.entry(key).or_default();
        if h.counts.len() != self.buckets.len() {
            h.counts = vec![0; self.buckets.len()];
        }
        if let Some(i) = self.buckets.iter().position(|b| v <= *b) {
            h.counts[i] += 1;
        }
        h.sum += v;
        h.count += 1;
    }

    /// Removes every series whose `label` is `value`.
    pub fn remove(&self, label: &str, value: &str) {
        if let Some(i) = self.labels.iter().position(|l| *l == label) {
            lock(&self.values).retain(|k, _| k.get(i).map(String::as_str) != Some(value));
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
pub fn sample(out: &mut String, name: &str, labels: &[&str], values: &[String], le: Option<&str>, value: &str) {
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
        let vals: Vec<String> = set.iter().map(|(_, v)| (*v).to_owned()).collect();
        sample(out, name, &names, &vals, None, &v.to_string());
    }
}
