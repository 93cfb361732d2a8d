//! Argo CD cluster secrets for agents: the model is the principal's
//! ([`principal::cluster_secret`]), shared with its self-registration; the flag parsing of
//! `agent create` is here.

use std::collections::BTreeMap;

use anyhow::bail;
pub use principal::cluster_secret::*;

/// `key=value` flags as a map (upstream's `labelSliceToMap`: a key may be given once); `flag`
/// names the flag in errors.
///
/// # Errors
/// A flag is not `key=value`, or a key repeats.
pub fn parse_labels(flags: &[String], flag: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    for item in flags.iter().map(|f| f.trim()).filter(|f| !f.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            bail!("cannot parse label {item:?} ({flag}): expected key=value");
        };
        if key.is_empty() {
            bail!("cannot parse label {item:?} ({flag}): the key is empty");
        }
        if let Some(previous) = labels.insert(key.to_owned(), value.to_owned()) {
            bail!("label {key:?} given twice ({flag}), first with value {previous:?}");
        }
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_as_upstreams_label_slice() {
        let labels = parse_labels(&["a=1".into(), "b=".into()], "-l").unwrap();
        assert_eq!(labels.get("a").map(String::as_str), Some("1"));
        assert!(parse_labels(&["a".into()], "-l").is_err());
        assert!(parse_labels(&["a=1".into(), "a=2".into()], "-l").is_err());
    }
}
