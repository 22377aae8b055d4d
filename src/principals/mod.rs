//! Principals: who may call the gateway, with which credentials, on which destinations and
//! runs, with which actions and how large a share of it.
//!
//! A principal comes from the principals file (`FILAMENT_PRINCIPALS_FILE`, parsed and
//! validated whole by [`file`], reloaded without a restart by [`watch`]) or is the `default`
//! principal of the simple mode (`FILAMENT_API_TOKENS`: every action, every destination). A
//! request's credential selects one ([`PrincipalSet::by_token`] in constant time over every
//! digest, or [`PrincipalSet::by_email`] for a verified Google ID token, [`id_token`]); the
//! HTTP layer (`api::auth`) then carries it as the request's caller and the handlers check its
//! scopes. The file never holds a token: only SHA-256 digests.

pub(crate) mod file;
pub(crate) mod id_token;
mod jwks;
pub(crate) mod watch;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

/// The name of the simple mode's principal (`FILAMENT_API_TOKENS`).
pub(crate) const DEFAULT_PRINCIPAL: &str = "default";

/// A principal's name: letters, digits, `-` and `_`, 1 to 64 characters. It appears in logs,
/// metrics and the run view.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PrincipalName(String);

impl PrincipalName {
    pub(crate) fn parse(value: &str) -> Result<Self, String> {
        let valid = !value.is_empty()
            && value.len() <= 64
            && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if valid {
            Ok(Self(value.to_string()))
        } else {
            Err(format!("name {value:?} must be 1 to 64 letters, digits, `-` or `_`"))
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PrincipalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a principal may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Runs, resources, executions, batches, checkpoints, pause.
    Write,
    Commit,
    Abort,
    /// Its own runs.
    Read,
    /// Every run (operators, dashboards).
    ReadAll,
}

impl Action {
    pub(crate) const ALL: [Action; 5] = [Action::Write, Action::Commit, Action::Abort, Action::Read, Action::ReadAll];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Action::Write => "write",
            Action::Commit => "commit",
            Action::Abort => "abort",
            Action::Read => "read",
            Action::ReadAll => "read_all",
        }
    }

    pub(crate) fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|action| action.as_str() == value)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Actions(u8);

impl Actions {
    /// Every action.
    pub(crate) fn all() -> Self {
        Self::from_iter(Action::ALL)
    }

    /// What a principal may do when its entry names no `actions`: all but `read_all`.
    pub(crate) fn default_for_principal() -> Self {
        Self::from_iter([Action::Write, Action::Commit, Action::Abort, Action::Read])
    }

    pub(crate) fn contains(self, action: Action) -> bool {
        self.0 & action.bit() != 0
    }
}

impl FromIterator<Action> for Actions {
    fn from_iter<I: IntoIterator<Item = Action>>(actions: I) -> Self {
        Self(actions.into_iter().fold(0, |bits, action| bits | action.bit()))
    }
}

/// One part (project or dataset) of a destination pattern: `*` matches any run of characters
/// within the part, never across the dot.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PartPattern(String);

impl PartPattern {
    fn matches(&self, text: &str) -> bool {
        glob_matches(self.0.as_bytes(), text.as_bytes())
    }
}

/// `*`-only glob matching (iterative, linear in practice: backtracks to the last star only).
fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut last_star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            last_star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star, matched)) = last_star {
            p = star + 1;
            t = matched + 1;
            last_star = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// `project.dataset`, each part literal or with `*` wildcards (`acme-prod.raw_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DestinationPattern {
    project: PartPattern,
    dataset: PartPattern,
}

impl DestinationPattern {
    pub(crate) fn parse(value: &str) -> Result<Self, String> {
        // A dataset has no dot; a domain-scoped project (`example.com:proj`) may.
        let Some((project, dataset)) = value.rsplit_once('.') else {
            return Err(format!("destination {value:?} must be `project.dataset` (`*` matches within a part)"));
        };
        let part_ok = |part: &str, extra: &[char]| {
            !part.is_empty()
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '*' || c == '_' || extra.contains(&c))
        };
        if !part_ok(project, &['-', ':', '.']) || !part_ok(dataset, &[]) {
            return Err(format!(
                "destination {value:?}: a project takes letters, digits, `-`, `:` and `*`; a dataset letters, digits, `_` and `*`"
            ));
        }
        Ok(Self { project: PartPattern(project.to_string()), dataset: PartPattern(dataset.to_string()) })
    }

    /// Every destination (the simple mode's principal).
    fn everything() -> Self {
        Self { project: PartPattern("*".into()), dataset: PartPattern("*".into()) }
    }

    pub(crate) fn matches(&self, project: &str, dataset: &str) -> bool {
        self.project.matches(project) && self.dataset.matches(dataset)
    }

    /// Whether the pattern names `project` (with any dataset).
    pub(crate) fn matches_project(&self, project: &str) -> bool {
        self.project.matches(project)
    }
}

/// One principal, as the file declared it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Principal {
    pub(crate) name: PrincipalName,
    /// SHA-256 digests of its bearer tokens.
    pub(crate) token_sha256: Vec<[u8; 32]>,
    /// Lowercased e-mails of the service accounts whose Google ID tokens identify it.
    pub(crate) google_service_accounts: Vec<String>,
    pub(crate) destinations: Vec<DestinationPattern>,
    pub(crate) run_id_prefix: Option<String>,
    pub(crate) actions: Actions,
    /// Its share of the upload budget and of concurrent requests.
    pub(crate) max_buffered_bytes: Option<usize>,
    pub(crate) max_concurrent_requests: Option<usize>,
    /// Console sessions opened before this instant are refused (an operator ends them all).
    pub(crate) sessions_not_before: Option<chrono::DateTime<chrono::Utc>>,
}

/// The credential a request authenticated with: what a console session is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Credential {
    /// An opaque token, by its SHA-256 digest.
    Token { digest: [u8; 32] },
    /// A Google ID token of this service account, valid until `expires_at_unix_secs`.
    ServiceAccount { email: String, expires_at_unix_secs: u64 },
}

impl Credential {
    /// A fingerprint of the credential (not of the token: of its digest, or of the e-mail),
    /// short and one-way, to carry in a session cookie: 128 bits of SHA-256 over a domain tag.
    pub(crate) fn fingerprint(&self) -> String {
        match self {
            Credential::Token { digest } => token_fingerprint(digest),
            Credential::ServiceAccount { email, .. } => service_account_fingerprint(email),
        }
    }
}

fn token_fingerprint(digest: &[u8; 32]) -> String {
    fingerprint(b"token", digest)
}

fn service_account_fingerprint(email: &str) -> String {
    fingerprint(b"service-account", email.as_bytes())
}

fn fingerprint(kind: &[u8], identity: &[u8]) -> String {
    let digest = Sha256::new()
        .chain_update(b"filament-console-session\0")
        .chain_update(kind)
        .chain_update(b"\0")
        .chain_update(identity)
        .finalize();
    hex::encode(&digest[..16])
}

impl Principal {
    /// Whether the credential of `fingerprint` is still one of the principal's (a rotated
    /// token or a removed service account no longer is).
    pub(crate) fn lists_credential(&self, fingerprint: &str) -> bool {
        let tokens = self.token_sha256.iter().map(token_fingerprint);
        let accounts = self.google_service_accounts.iter().map(|email| service_account_fingerprint(email));
        tokens.chain(accounts).any(|listed| listed == fingerprint)
    }

    /// The simple mode's principal: the tokens of `FILAMENT_API_TOKENS`, every action and
    /// destination.
    pub(crate) fn default_with_tokens(tokens: &[String]) -> Self {
        Self {
            name: PrincipalName(DEFAULT_PRINCIPAL.to_string()),
            token_sha256: tokens.iter().map(|token| token_digest(token)).collect(),
            google_service_accounts: Vec::new(),
            destinations: vec![DestinationPattern::everything()],
            run_id_prefix: None,
            actions: Actions::all(),
            max_buffered_bytes: None,
            max_concurrent_requests: None,
            sessions_not_before: None,
        }
    }

    pub(crate) fn may(&self, action: Action) -> bool {
        self.actions.contains(action)
    }

    pub(crate) fn may_write_to(&self, project: &str, dataset: &str) -> bool {
        self.destinations.iter().any(|pattern| pattern.matches(project, dataset))
    }

    pub(crate) fn may_name_run(&self, run_id: &str) -> bool {
        self.run_id_prefix.as_deref().is_none_or(|prefix| run_id.starts_with(prefix))
    }
}

/// The SHA-256 digest of a bearer token, as the principals file lists it.
pub(crate) fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.trim().as_bytes()).into()
}

/// The principals in force.
#[derive(Debug, Default)]
pub(crate) struct PrincipalSet {
    principals: Vec<Arc<Principal>>,
    by_email: HashMap<String, usize>,
}

impl PrincipalSet {
    /// The set of `principals`, whose names, digests and e-mails the caller checked unique.
    pub(crate) fn new(principals: Vec<Principal>) -> Self {
        let principals: Vec<Arc<Principal>> = principals.into_iter().map(Arc::new).collect();
        let by_email = principals
            .iter()
            .enumerate()
            .flat_map(|(index, p)| p.google_service_accounts.iter().map(move |email| (email.clone(), index)))
            .collect();
        Self { principals, by_email }
    }

    /// The principal holding `token`: every digest is compared, so the time taken does not
    /// tell which one matched, or whether any did.
    pub(crate) fn by_token(&self, token: &str) -> Option<Arc<Principal>> {
        let presented = token_digest(token);
        let mut found: Option<usize> = None;
        for (index, principal) in self.principals.iter().enumerate() {
            for known in &principal.token_sha256 {
                if bool::from(known.ct_eq(&presented)) {
                    found = Some(index);
                }
            }
        }
        found.map(|index| Arc::clone(&self.principals[index]))
    }

    /// The principal a verified Google ID token's (lowercased) e-mail selects.
    pub(crate) fn by_email(&self, email: &str) -> Option<Arc<Principal>> {
        self.by_email.get(email).map(|&index| Arc::clone(&self.principals[index]))
    }

    /// The principal named `name` (a console session names its principal).
    pub(crate) fn by_name(&self, name: &str) -> Option<Arc<Principal>> {
        self.principals.iter().find(|p| p.name.as_str() == name).cloned()
    }

    pub(crate) fn len(&self) -> usize {
        self.principals.len()
    }

    pub(crate) fn token_count(&self) -> usize {
        self.principals.iter().map(|p| p.token_sha256.len()).sum()
    }

    pub(crate) fn service_account_count(&self) -> usize {
        self.by_email.len()
    }
}

/// The principals in force, swapped whole on reload: a request reads the set once and keeps
/// it, so a reload never changes a request half-way.
#[derive(Debug, Clone)]
pub(crate) struct Principals {
    current: Arc<ArcSwap<PrincipalSet>>,
}

impl Principals {
    pub(crate) fn new(set: PrincipalSet) -> Self {
        Self { current: Arc::new(ArcSwap::from_pointee(set)) }
    }

    pub(crate) fn current(&self) -> Arc<PrincipalSet> {
        self.current.load_full()
    }

    pub(crate) fn replace(&self, set: PrincipalSet) {
        self.current.store(Arc::new(set));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destination_patterns_match_within_one_part() {
        let pattern = DestinationPattern::parse("acme-prod.raw_*").unwrap();
        assert!(pattern.matches("acme-prod", "raw_orders"));
        assert!(pattern.matches("acme-prod", "raw_"));
        assert!(!pattern.matches("acme-prod", "staging"));
        assert!(!pattern.matches("acme-prod-2", "raw_orders"));
        let pattern = DestinationPattern::parse("acme-*.scratch").unwrap();
        assert!(pattern.matches("acme-dev", "scratch"));
        assert!(!pattern.matches("other", "scratch"));
        assert!(DestinationPattern::parse("*.*").unwrap().matches("any-project", "any_dataset"));
        assert!(DestinationPattern::parse("no-dot").is_err());
        let domain_scoped = DestinationPattern::parse("example.com:acme-prod.raw_*").unwrap();
        assert!(domain_scoped.matches("example.com:acme-prod", "raw_orders"));
        assert!(DestinationPattern::parse("p.d-with-dash").is_err());
        assert!(glob_matches(b"a*b*c", b"aXXbYYc") && !glob_matches(b"a*b*c", b"aXXbYY"));
    }

    #[test]
    fn a_token_selects_its_principal_and_no_other() {
        let mut acme = Principal::default_with_tokens(&["token-of-acme-0123456789".to_string()]);
        acme.name = PrincipalName::parse("acme").unwrap();
        let other = Principal::default_with_tokens(&["token-of-other-0123456789".to_string()]);
        let set = PrincipalSet::new(vec![acme, other]);
        assert_eq!(set.by_token("token-of-acme-0123456789").unwrap().name.as_str(), "acme");
        assert_eq!(set.by_token("token-of-other-0123456789").unwrap().name.as_str(), DEFAULT_PRINCIPAL);
        assert!(set.by_token("token-of-nobody").is_none());
    }

    #[test]
    fn default_actions_leave_out_read_all() {
        let actions = Actions::default_for_principal();
        assert!(actions.contains(Action::Write) && actions.contains(Action::Read));
        assert!(!actions.contains(Action::ReadAll));
        assert!(Actions::all().contains(Action::ReadAll));
    }
}
