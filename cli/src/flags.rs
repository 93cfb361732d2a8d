//! Flags and environment variables parse as upstream's do (Go's pflag, and the env helpers
//! behind `argocd-agent-params`), so an upstream command line or ConfigMap works unchanged:
//!
//! * a **boolean flag** may stand alone (`--insecure-plaintext` means true) or carry its value
//!   after `=` (`--insecure-plaintext=false`), with pflag's spellings (`true`, `t`, `1`, `false`,
//!   `f`, `0`, any case; `yes`/`no`/`on`/`off` as well). A separate word after it is not its
//!   value (`--flag false` is `--flag` and a stray `false`), as with pflag;
//! * an **empty environment variable** is unset: its flag takes its default (upstream's manifests
//!   wire every ConfigMap key to an env var, and a key left empty means "the default").

use std::time::Duration;

use anyhow::Context as _;
use clap::builder::BoolishValueParser;
use clap::{Arg, ArgAction, Command};

/// `cmd` and all its subcommands, with every argument adjusted as the module says.
pub(crate) fn upstream_style(cmd: Command) -> Command {
    cmd.mut_args(adjust).mut_subcommands(upstream_style)
}

fn adjust(arg: Arg) -> Arg {
    let arg = unset_if_empty(arg);
    let flag = matches!(arg.get_action(), ArgAction::SetTrue);
    let optional = matches!(arg.get_action(), ArgAction::Set)
        && arg.get_value_parser().type_id() == std::any::TypeId::of::<bool>()
        && arg.get_long().is_some();
    if !flag && !optional {
        return arg;
    }
    let arg = arg
        .action(ArgAction::Set)
        .num_args(0..=1)
        .require_equals(true)
        .default_missing_value("true")
        .value_parser(BoolishValueParser::new());
    // A plain `bool` (`SetTrue`) was false when absent; an `Option<bool>` stays `None`.
    if flag { arg.default_value("false") } else { arg }
}

/// An argument whose environment variable is set to the empty string reads as if it were unset.
fn unset_if_empty(arg: Arg) -> Arg {
    match arg.get_env().map(std::env::var_os) {
        Some(Some(value)) if value.is_empty() => arg.env(None),
        _ => arg,
    }
}

/// The `--label-selector` value of either binary (empty: none).
///
/// # Errors
/// The text is not a Kubernetes label selector; the error names the flag.
pub fn label_selector(text: Option<&str>) -> anyhow::Result<Option<protocol::selector::LabelSelector>> {
    use anyhow::Context as _;
    match text.map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(t) => {
            protocol::selector::LabelSelector::parse(t).map(Some).with_context(|| format!("--label-selector {t:?}"))
        }
    }
}

/// Parse a Go-style duration (`30s`, `1m`, `1m30s`, `500ms`, `0`).
///
/// # Errors
/// The text is not such a duration.
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let t = text.trim();
    if t == "0" || t.is_empty() {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        let (num, tail) = rest.split_at(digits);
        let unit_len = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let n: f64 = num.parse().with_context(|| format!("duration {text:?}: expected e.g. 30s, 1m30s or 500ms"))?;
        let secs = match unit {
            "ms" => n / 1000.0,
            "s" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            _ => anyhow::bail!("duration {text:?}: unknown unit {unit:?} (use ms, s, m or h)"),
        };
        total += Duration::from_secs_f64(secs);
        rest = next;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Demo {
        #[arg(long, default_value_t = false)]
        plain: bool,
        #[arg(long)]
        optional: Option<bool>,
        #[arg(long, default_value = "d")]
        text: String,
    }

    fn parse(args: &[&str]) -> Result<Demo, clap::Error> {
        let cmd = upstream_style(Demo::command());
        let matches = cmd.try_get_matches_from(std::iter::once("demo").chain(args.iter().copied()))?;
        Demo::from_arg_matches(&matches)
    }

    #[test]
    fn booleans_parse_as_pflag_parses_them() {
        let cases: &[(&[&str], bool, Option<bool>)] = &[
            (&[], false, None),
            (&["--plain"], true, None),
            (&["--plain=true"], true, None),
            (&["--plain=false"], false, None),
            (&["--plain=T", "--optional=0"], true, Some(false)),
            (&["--plain=f", "--optional=1"], false, Some(true)),
            (&["--optional"], false, Some(true)),
            (&["--optional=FALSE"], false, Some(false)),
        ];
        for (args, plain, optional) in cases {
            let demo = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!((demo.plain, demo.optional), (*plain, *optional), "{args:?}");
        }
        let e = parse(&["--plain=maybe"]).expect_err("not a boolean");
        assert!(e.to_string().contains("maybe"), "{e}");
        assert!(parse(&["--plain", "false"]).is_err(), "a separate word is not the flag's value, as with pflag");
        assert_eq!(parse(&["--text", "x"]).expect("other flags keep their syntax").text, "x");
    }

    /// Every boolean flag of every command and subcommand takes pflag's forms.
    #[test]
    fn every_boolean_flag_of_every_command_takes_the_bare_and_the_equals_form() {
        fn walk(cmd: &Command, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
            for arg in cmd.get_arguments() {
                if arg.get_value_parser().type_id() == std::any::TypeId::of::<bool>()
                    && let Some(long) = arg.get_long()
                {
                    out.push((path.clone(), long.to_owned()));
                }
            }
            for sub in cmd.get_subcommands() {
                path.push(sub.get_name().to_owned());
                walk(sub, path, out);
                path.pop();
            }
        }
        for (name, cmd) in [("argocd-agent", crate::Cli::command()), ("argocd-agentctl", crate::ctl::Cli::command())] {
            let cmd = upstream_style(cmd);
            let mut flags = Vec::new();
            walk(&cmd, &mut vec![name.to_owned()], &mut flags);
            assert!(!flags.is_empty(), "{name} has boolean flags");
            for (path, long) in &flags {
                for form in [format!("--{long}"), format!("--{long}=true"), format!("--{long}=F")] {
                    let args: Vec<&str> = path.iter().map(String::as_str).chain([form.as_str()]).collect();
                    if let Err(e) = cmd.clone().try_get_matches_from(&args) {
                        // Other required arguments may be missing; this flag must not be the problem.
                        assert!(
                            e.kind() == clap::error::ErrorKind::MissingRequiredArgument
                                || e.kind() == clap::error::ErrorKind::MissingSubcommand
                                || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand,
                            "{args:?}: {e}"
                        );
                    }
                }
            }
        }
    }

    /// A value of upstream's type that our parser must take (a few flags check their values).
    fn sample(flag: &str, ty: &str) -> &'static str {
        match (flag, ty) {
            ("log-format", _) => "json",
            ("agent-mode", _) => "managed",
            ("source-uid-mismatch-policy", _) => "upsert",
            ("adoption-policy", _) => "never",
            ("on-application-recreate", _) => "resync",
            (_, "bool") => "false",
            (_, "int") => "0",
            (_, "duration") => "1s",
            (_, "stringSlice") => "a,b",
            _ => "x",
        }
    }

    /// Every flag of upstream's principal and agent (`cli/tests/upstream_flags.tsv`, read from
    /// upstream's source) exists here with its name, short name and environment variable, and
    /// takes a value of upstream's type on the command line (booleans also bare), as pflag does.
    #[test]
    fn every_upstream_flag_and_environment_variable_is_ours_too() {
        let table = include_str!("../tests/upstream_flags.tsv");
        let cmd = upstream_style(crate::Cli::command());
        let mut problems = Vec::new();
        let mut rows = 0;
        for line in table.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let cols: Vec<&str> = line.split('\t').collect();
            let [role, flag, short, ty, env] = cols[..] else {
                problems.push(format!("malformed row {line:?}"));
                continue;
            };
            rows += 1;
            let Some(sub) = cmd.find_subcommand(role) else {
                problems.push(format!("no command {role}"));
                continue;
            };
            let Some(arg) = sub.get_arguments().find(|a| a.get_long() == Some(flag)) else {
                problems.push(format!("{role} --{flag}: missing"));
                continue;
            };
            let ours = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            let theirs = (env != "-").then(|| env.to_owned());
            if ours != theirs {
                problems.push(format!("{role} --{flag}: environment variable {ours:?}, upstream {theirs:?}"));
            }
            let short_ours = arg.get_short().map(String::from);
            let short_theirs = (short != "-").then(|| short.to_owned());
            if short_ours != short_theirs {
                problems.push(format!("{role} --{flag}: short name {short_ours:?}, upstream {short_theirs:?}"));
            }
            let mut forms = vec![format!("--{flag}={}", sample(flag, ty))];
            if ty == "bool" {
                forms.push(format!("--{flag}"));
            }
            for form in forms {
                if let Err(e) = cmd.clone().try_get_matches_from(["argocd-agent", role, form.as_str()])
                    && e.kind() != clap::error::ErrorKind::MissingRequiredArgument
                {
                    problems.push(format!("{role} {form}: {e}"));
                }
            }
        }
        assert!(rows > 100, "the table has every upstream flag ({rows} rows)");
        assert!(problems.is_empty(), "{} differences from upstream:\n{}", problems.len(), problems.join("\n"));
    }
}
