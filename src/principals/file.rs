//! The principals file: one `[[principal]]` table per principal, parsed and validated whole.
//! A file that does not parse or validate is refused with the line of the first problem, and
//! the caller keeps the principals in force.
//!
//! ```toml
//! [[principal]]
//! name = "acme-orders"
//! token_sha256 = ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
//! google_service_accounts = ["orders-extractor@acme-prod.iam.gserviceaccount.com"]
//! destinations = ["acme-prod.raw_*"]
//! run_id_prefix = "orders-"
//! actions = ["write", "commit", "abort", "read"]
//! max_buffered_bytes = 16777216
//! max_concurrent_requests = 32
//! ```

use std::collections::HashSet;

use serde::Deserialize;

use super::{Action, Actions, DEFAULT_PRINCIPAL, DestinationPattern, Principal, PrincipalName};

/// A run id is at most 64 characters; a generated one is the prefix, `run_` and 24 hex digits.
const MAX_RUN_ID_PREFIX_CHARS: usize = 36;

/// Why a principals file was refused: the line (1-based) and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub(crate) struct FileRefused {
    pub(crate) line: usize,
    pub(crate) message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalsFile {
    #[serde(default)]
    principal: Vec<toml::Spanned<PrincipalEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalEntry {
    name: String,
    #[serde(default)]
    token_sha256: Vec<String>,
    #[serde(default)]
    google_service_accounts: Vec<String>,
    /// Optional for a principal that only reads (no `write`, `commit` or `abort`).
    #[serde(default)]
    destinations: Vec<String>,
    run_id_prefix: Option<String>,
    actions: Option<Vec<String>>,
    max_buffered_bytes: Option<u64>,
    max_concurrent_requests: Option<u64>,
    /// RFC 3339: console sessions opened before it are refused.
    sessions_not_before: Option<String>,
}

/// The principals `text` declares, each checked, and unique in names, digests and e-mails.
/// `reserved_default` refuses a principal named `default` (the simple mode's, when
/// `FILAMENT_API_TOKENS` is set too).
pub(crate) fn parse(text: &str, reserved_default: bool) -> Result<Vec<Principal>, FileRefused> {
    let file: PrincipalsFile = toml::from_str(text).map_err(|error| FileRefused {
        line: error.span().map_or(1, |span| line_of(text, span.start)),
        message: error.message().to_string(),
    })?;
    let mut seen = Seen::default();
    let mut principals = Vec::with_capacity(file.principal.len());
    for entry in file.principal {
        let line = line_of(text, entry.span().start);
        let principal = check(entry.into_inner(), reserved_default)
            .and_then(|principal| seen.add(&principal).map(|()| principal))
            .map_err(|message| FileRefused { line, message })?;
        principals.push(principal);
    }
    Ok(principals)
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// One entry checked into a principal.
fn check(entry: PrincipalEntry, reserved_default: bool) -> Result<Principal, String> {
    let name = PrincipalName::parse(&entry.name)?;
    let within = |what: &str| format!("principal {:?}: {what}", entry.name);
    if reserved_default && name.as_str() == DEFAULT_PRINCIPAL {
        return Err(within("`default` is the principal of FILAMENT_API_TOKENS; choose another name"));
    }
    let token_sha256 =
        entry.token_sha256.iter().map(|hex| digest(hex).map_err(|e| within(&e))).collect::<Result<_, _>>()?;
    let google_service_accounts = entry
        .google_service_accounts
        .iter()
        .map(|email| service_account(email).map_err(|e| within(&e)))
        .collect::<Result<Vec<_>, _>>()?;
    if entry.token_sha256.is_empty() && google_service_accounts.is_empty() {
        return Err(within("needs a token_sha256 or a google_service_accounts entry to be usable"));
    }
    let actions = match &entry.actions {
        None => Actions::default_for_principal(),
        Some(names) => names
            .iter()
            .map(|a| {
                Action::parse(a)
                    .ok_or_else(|| within(&format!("unknown action {a:?} (write, commit, abort, read, read_all)")))
            })
            .collect::<Result<Actions, _>>()?,
    };
    // A principal that may change a run needs somewhere to write; one that only reads (a
    // dashboard, an operator's console) does not.
    let changes_runs = [Action::Write, Action::Commit, Action::Abort].into_iter().any(|a| actions.contains(a));
    if changes_runs && entry.destinations.is_empty() {
        return Err(within("destinations is empty: it could write nowhere"));
    }
    let destinations = entry
        .destinations
        .iter()
        .map(|d| DestinationPattern::parse(d).map_err(|e| within(&e)))
        .collect::<Result<_, _>>()?;
    if let Some(prefix) = &entry.run_id_prefix
        && (prefix.is_empty()
            || prefix.len() > MAX_RUN_ID_PREFIX_CHARS
            || !prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    {
        return Err(within(&format!(
            "run_id_prefix must be 1 to {MAX_RUN_ID_PREFIX_CHARS} letters, digits, `-` or `_` (a run id starts with it, and generated ids need room after it)"
        )));
    }
    Ok(Principal {
        name,
        token_sha256,
        google_service_accounts,
        destinations,
        run_id_prefix: entry.run_id_prefix,
        actions,
        max_buffered_bytes: positive(entry.max_buffered_bytes, "max_buffered_bytes").map_err(|e| within(&e))?,
        max_concurrent_requests: positive(entry.max_concurrent_requests, "max_concurrent_requests")
            .map_err(|e| within(&e))?,
        sessions_not_before: entry
            .sessions_not_before
            .as_deref()
            .map(|text| {
                chrono::DateTime::parse_from_rfc3339(text)
                    .map(|at| at.with_timezone(&chrono::Utc))
                    .map_err(|_| within(&format!("sessions_not_before {text:?} is not an RFC 3339 instant")))
            })
            .transpose()?,
    })
}

fn digest(hex_text: &str) -> Result<[u8; 32], String> {
    let mut digest = [0u8; 32];
    hex::decode_to_slice(hex_text.trim(), &mut digest)
        .map_err(|_| "token_sha256 entries are 64 hex digits (the SHA-256 of a token, never the token)".to_string())?;
    Ok(digest)
}

fn service_account(email: &str) -> Result<String, String> {
    let email = email.trim().to_ascii_lowercase();
    match email.split_once('@') {
        Some((user, domain)) if !user.is_empty() && domain.contains('.') && !email.contains(char::is_whitespace) => {
            Ok(email)
        }
        _ => Err(format!("google_service_accounts entry {email:?} is not an e-mail address")),
    }
}

fn positive(value: Option<u64>, field: &str) -> Result<Option<usize>, String> {
    match value {
        Some(0) => Err(format!("{field} must be at least 1")),
        Some(v) => usize::try_from(v).map(Some).map_err(|_| format!("{field} is too large")),
        None => Ok(None),
    }
}

/// What earlier entries took: a name, digest or e-mail selects one principal only.
#[derive(Default)]
struct Seen {
    names: HashSet<String>,
    digests: HashSet<[u8; 32]>,
    emails: HashSet<String>,
    /// (run-id prefix, principal): a run id must select one principal's prefix at most.
    prefixes: Vec<(String, String)>,
}

impl Seen {
    fn add(&mut self, principal: &Principal) -> Result<(), String> {
        let name = principal.name.as_str();
        if !self.names.insert(name.to_string()) {
            return Err(format!("principal {name:?} is declared twice"));
        }
        if principal.token_sha256.iter().any(|d| !self.digests.insert(*d)) {
            return Err(format!(
                "principal {name:?}: a token_sha256 is listed twice (one token selects one principal)"
            ));
        }
        if let Some(email) = principal.google_service_accounts.iter().find(|e| !self.emails.insert((*e).clone())) {
            return Err(format!("principal {name:?}: service account {email} is listed twice"));
        }
        if let Some(prefix) = &principal.run_id_prefix {
            // Overlapping prefixes let one principal probe or squat the other's run ids.
            let overlapping =
                self.prefixes.iter().find(|(other, _)| other.starts_with(prefix) || prefix.starts_with(other));
            if let Some((other, owner)) = overlapping {
                return Err(format!(
                    "principal {name:?}: run_id_prefix {prefix:?} overlaps principal {owner:?}'s {other:?} (one may not be a prefix of the other)"
                ));
            }
            self.prefixes.push((prefix.clone(), name.to_string()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn entry(name: &str, extra: &str) -> String {
        format!("[[principal]]\nname = \"{name}\"\ntoken_sha256 = [\"{DIGEST}\"]\ndestinations = [\"p.d\"]\n{extra}\n")
    }

    #[test]
    fn a_valid_file_gives_its_principals_with_default_actions() {
        let principals = parse(&entry("acme", "run_id_prefix = \"acme-\""), true).unwrap();
        assert_eq!(principals.len(), 1);
        assert_eq!(principals[0].name.as_str(), "acme");
        assert!(principals[0].may(Action::Commit) && !principals[0].may(Action::ReadAll));
        assert!(principals[0].may_name_run("acme-1") && !principals[0].may_name_run("other-1"));
        let longest = format!("run_id_prefix = \"{}\"", "p".repeat(MAX_RUN_ID_PREFIX_CHARS));
        assert!(parse(&entry("acme", &longest), true).is_ok());
        let too_long = format!("run_id_prefix = \"{}\"", "p".repeat(MAX_RUN_ID_PREFIX_CHARS + 1));
        let refused = parse(&entry("acme", &too_long), true).unwrap_err();
        assert!(refused.message.contains("run_id_prefix must be 1 to 36"), "{refused}");
    }

    #[test]
    fn refusals_name_the_line() {
        let text = format!("{}\n{}", entry("a", ""), entry("b", "actions = [\"fly\"]"));
        let refused = parse(&text, true).unwrap_err();
        assert_eq!(refused.line, 7, "{refused}");
        assert!(refused.message.contains("unknown action \"fly\""), "{refused}");
        let refused = parse("[[principal]]\nname = \"a\"\nbogus = 1\n", true).unwrap_err();
        assert_eq!(refused.line, 3, "{refused}");
        let refused = parse("[[principal]\n", true).unwrap_err();
        assert_eq!(refused.line, 1, "{refused}");
    }

    #[test]
    fn duplicates_and_unusable_entries_are_refused() {
        let twice = format!("{}{}", entry("a", ""), entry("b", ""));
        assert!(parse(&twice, true).unwrap_err().message.contains("listed twice"));
        assert!(parse(&entry("default", ""), true).unwrap_err().message.contains("FILAMENT_API_TOKENS"));
        assert!(parse(&entry("default", ""), false).is_ok());
        let bad_digest = "[[principal]]\nname = \"a\"\ntoken_sha256 = [\"my-token\"]\ndestinations = [\"p.d\"]\n";
        assert!(parse(bad_digest, true).unwrap_err().message.contains("never the token"));
        let no_credential = "[[principal]]\nname = \"a\"\ndestinations = [\"p.d\"]\n";
        assert!(parse(no_credential, true).unwrap_err().message.contains("usable"));
        assert!(parse(&entry("a", "max_buffered_bytes = 0"), true).unwrap_err().message.contains("at least 1"));
    }

    #[test]
    fn run_id_prefixes_where_one_is_a_prefix_of_another_are_refused() {
        let second = |name: &str, tokens: &str, prefix: &str| {
            format!(
                "[[principal]]\nname = \"{name}\"\ntoken_sha256 = [\"{tokens}\"]\ndestinations = [\"p.d\"]\nrun_id_prefix = \"{prefix}\"\n"
            )
        };
        let other_digest = "a".repeat(64);
        for (first, other) in [("acme-", "acme-eu-"), ("acme-eu-", "acme-"), ("acme-", "acme-")] {
            let text = format!(
                "{}{}",
                entry("acme", &format!("run_id_prefix = \"{first}\"")),
                second("b", &other_digest, other)
            );
            let refused = parse(&text, true).unwrap_err();
            assert!(refused.message.contains("overlaps principal \"acme\""), "{first} / {other}: {refused}");
        }
        let text = format!("{}{}", entry("acme", "run_id_prefix = \"acme-\""), second("b", &other_digest, "beta-"));
        assert_eq!(parse(&text, true).unwrap().len(), 2, "disjoint prefixes");
    }

    #[test]
    fn a_principal_that_only_reads_needs_no_destinations() {
        let reader = |actions: &str| {
            format!("[[principal]]\nname = \"ops\"\ntoken_sha256 = [\"{DIGEST}\"]\nactions = [{actions}]\n")
        };
        let principals = parse(&reader("\"read_all\""), true).expect("a read-only principal loads");
        assert!(principals[0].may(Action::ReadAll) && principals[0].destinations.is_empty());
        assert!(parse(&reader("\"read\", \"read_all\""), true).is_ok());
        let empty = "[[principal]]\nname = \"ops\"\ntoken_sha256 = [\"x\"]\ndestinations = []\nactions = [\"read\"]\n";
        assert!(parse(&empty.replace("\"x\"", &format!("\"{DIGEST}\"")), true).is_ok());
        for changing in ["\"write\"", "\"commit\"", "\"abort\"", "\"read\", \"commit\""] {
            let refused = parse(&reader(changing), true).unwrap_err();
            assert!(refused.message.contains("destinations is empty: it could write nowhere"), "{changing}: {refused}");
        }
        let default_actions = format!("[[principal]]\nname = \"a\"\ntoken_sha256 = [\"{DIGEST}\"]\n");
        assert!(parse(&default_actions, true).unwrap_err().message.contains("could write nowhere"));
    }
}
