//! The request UUIDs an agent has already taken (resource-proxy and Redis-proxy requests), so a
//! request the principal resends after a reconnect runs once; bounded, the oldest forgotten first.

use std::collections::{HashSet, VecDeque};

/// Request UUIDs remembered to recognise a resend.
pub(crate) const REMEMBERED: usize = 4096;

/// The last [`REMEMBERED`] request UUIDs seen.
#[derive(Debug, Default)]
pub(crate) struct RecentIds {
    set: HashSet<String>,
    order: VecDeque<String>,
}

impl RecentIds {
    /// Whether `uuid` arrives for the first time (remembering it).
    pub(crate) fn first_time(&mut self, uuid: &str) -> bool {
        if !self.set.insert(uuid.to_owned()) {
            return false;
        }
        self.order.push_back(uuid.to_owned());
        if self.order.len() > REMEMBERED
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resend_is_recognised_and_old_uuids_are_forgotten() {
        let mut recent = RecentIds::default();
        assert!(recent.first_time("a"));
        assert!(!recent.first_time("a"), "a resend");
        for i in 0..REMEMBERED {
            assert!(recent.first_time(&format!("u{i}")));
        }
        assert!(recent.first_time("a"), "remembered ids are bounded");
        assert_eq!(recent.set.len(), REMEMBERED);
    }
}
