//! Upstream flags that this implementation accepts but does not support yet.
//!
//! They parse (so upstream manifests and `argocd-agent-params` ConfigMaps keep working), and
//! setting one to anything but its inert value stops startup with a message naming the flag,
//! instead of being silently ignored.

/// Collects the flags that were set although their feature is not implemented.
#[derive(Debug, Default)]
pub struct Unsupported(Vec<String>);

impl Unsupported {
    /// Record `flag` when `set` is true.
    pub fn check(&mut self, flag: &str, set: bool) -> &mut Self {
        if set {
            self.0.push(flag.to_string());
        }
        self
    }

    /// Record `flag` when the option holds a value.
    #[allow(dead_code, reason = "for option-valued flags of features not here yet")]
    pub fn check_opt<T>(&mut self, flag: &str, v: &Option<T>) -> &mut Self {
        self.check(flag, v.is_some())
    }

    /// Record `flag` when a list is non-empty.
    #[allow(dead_code, reason = "for list-valued flags of features not here yet")]
    pub fn check_list<T>(&mut self, flag: &str, v: &[T]) -> &mut Self {
        self.check(flag, !v.is_empty())
    }

    /// Fail naming every such flag.
    ///
    /// # Errors
    /// One error listing the flags (and their env vars) to remove.
    pub fn finish(&self, command: &str) -> anyhow::Result<()> {
        if self.0.is_empty() {
            return Ok(());
        }
        anyhow::bail!(
            "{command}: not supported yet: {}. Remove these flags (or their environment variables); see docs/compatibility.md",
            self.0.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Unsupported;

    #[test]
    fn names_every_flag_that_was_set() {
        let mut u = Unsupported::default();
        u.check("--a", true).check_opt("--b", &Some(1)).check_opt::<u8>("--c", &None).check_list::<u8>("--d", &[]);
        let err = u.finish("principal").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("--a, --b") && !err.contains("--c") && !err.contains("--d"), "{err}");
        assert!(Unsupported::default().finish("agent").is_ok());
    }
}
