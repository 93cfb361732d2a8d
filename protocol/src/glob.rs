//! Globs as upstream's namespace and destination patterns use them: `*` (any run) and `?` (one
//! character), matched against the whole text.

/// Matches `text` against a glob with `*` (any run) and `?` (one character).
#[must_use]
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*", "agent-1"));
        assert!(glob_match("agent-?", "agent-1"));
        assert!(glob_match("ag*-1", "agent-1"));
        assert!(!glob_match("agent-?", "agent-12"));
        assert!(!glob_match("", "a"));
    }
}
