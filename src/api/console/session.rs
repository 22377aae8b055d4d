//! The console's sign-in session: a cookie that names the principal, the credential it was
//! opened with (by a one-way fingerprint, never the token), when it was opened and when it
//! ends, signed with HMAC-SHA256 (the `cookie` crate's signed jar). It is `HttpOnly` (no script
//! reads it) and `SameSite=Strict` (no other site's page sends it). When the gateway serves
//! HTTPS or is told it sits behind TLS (`FILAMENT_BEHIND_TLS`) it is `Secure` and named
//! `__Host-filament_session` (path `/`, no domain: no other host or path may set it);
//! otherwise it is `filament_session`, scoped to `/ui/`. It expires in the browser (`Max-Age`)
//! and here (the signed end time, no later than an ID token it was opened with).
//!
//! The console checks on every page ([`SessionClaims`]) that the principal it names is still
//! configured, still lists the credential (a rotated token or a removed service account ends
//! the session), and has no `sessions_not_before` after its opening.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use chrono::{DateTime, Utc};
use cookie::{Cookie, CookieJar, Key, SameSite};

use crate::principals::{Credential, Principal};

/// The cookie's name over plain HTTP.
pub(crate) const SESSION_COOKIE: &str = "filament_session";
/// Its name when `Secure`: the `__Host-` prefix binds it to this host and path `/`.
pub(crate) const SECURE_SESSION_COOKIE: &str = "__Host-filament_session";

/// The path the plain cookie is sent for.
const COOKIE_PATH: &str = "/ui/";

/// Bytes a key file must hold at least (the HKDF input of the signing key).
pub(crate) const MIN_KEY_FILE_BYTES: usize = 32;

/// Issues and checks session cookies.
#[derive(Clone)]
pub(crate) struct ConsoleSessions {
    key: Key,
    lifetime: Duration,
    /// `Secure`, `__Host-` cookies: the gateway serves HTTPS or sits behind TLS.
    secure: bool,
}

impl std::fmt::Debug for ConsoleSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a credential: never printed.
        f.debug_struct("ConsoleSessions").field("lifetime", &self.lifetime).field("secure", &self.secure).finish()
    }
}

/// Why a request has no session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoSession {
    /// No session cookie: never signed in, or signed out.
    Absent,
    /// The cookie's signature does not verify (another key, or altered).
    Forged,
    /// The session ended.
    Expired,
}

impl NoSession {
    /// The reason `audit.denied` records.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            NoSession::Absent => "no_session",
            NoSession::Forged => "session_signature_invalid",
            NoSession::Expired => "session_expired",
        }
    }
}

/// What a verified session cookie says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionClaims {
    pub(crate) principal: String,
    pub(crate) opened_at: DateTime<Utc>,
    /// [`Credential::fingerprint`] of the credential it was opened with.
    pub(crate) credential: String,
}

/// Why a session whose cookie verifies no longer stands for its principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionRevoked {
    /// The credential it was opened with is no longer the principal's.
    CredentialRemoved,
    /// The operator ended the principal's sessions opened before `sessions_not_before`.
    EndedByOperator,
}

impl SessionRevoked {
    /// The reason `audit.denied` records.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            SessionRevoked::CredentialRemoved => "session_credential_removed",
            SessionRevoked::EndedByOperator => "session_ended_by_operator",
        }
    }
}

impl SessionClaims {
    /// Whether the session still stands for `principal` as configured now.
    pub(crate) fn check(&self, principal: &Principal) -> Result<(), SessionRevoked> {
        if !principal.lists_credential(&self.credential) {
            return Err(SessionRevoked::CredentialRemoved);
        }
        if principal.sessions_not_before.is_some_and(|not_before| self.opened_at < not_before) {
            return Err(SessionRevoked::EndedByOperator);
        }
        Ok(())
    }
}

impl ConsoleSessions {
    /// Sessions signed with a key derived from `key_material` (the key file's bytes, at least
    /// [`MIN_KEY_FILE_BYTES`], checked by the caller), or with a random key of this process.
    pub(crate) fn new(key_material: Option<&[u8]>, lifetime: Duration, secure: bool) -> Self {
        let key = match key_material {
            Some(material) => Key::derive_from(material),
            None => Key::generate(),
        };
        Self { key, lifetime, secure }
    }

    /// Whether cookies are `Secure` (the gateway serves HTTPS or sits behind TLS).
    pub(crate) fn is_secure(&self) -> bool {
        self.secure
    }

    fn cookie_name(&self) -> &'static str {
        if self.secure { SECURE_SESSION_COOKIE } else { SESSION_COOKIE }
    }

    /// The `Set-Cookie` value of a new session of `principal`, opened at `now` with
    /// `credential`; it ends after the configured lifetime, or when an ID token it was opened
    /// with expires, whichever comes first.
    pub(crate) fn open(&self, principal: &str, credential: &Credential, now: DateTime<Utc>) -> HeaderValue {
        let lifetime = chrono::Duration::from_std(self.lifetime).unwrap_or(chrono::Duration::hours(8));
        let mut ends_at = (now + lifetime).timestamp();
        if let Credential::ServiceAccount { expires_at_unix_secs, .. } = credential {
            ends_at = ends_at.min(i64::try_from(*expires_at_unix_secs).unwrap_or(i64::MAX));
        }
        let value = format!("{ends_at}.{}.{}.{principal}", now.timestamp(), credential.fingerprint());
        let mut jar = CookieJar::new();
        jar.signed_mut(&self.key).add(Cookie::new(self.cookie_name(), value));
        let signed = jar.get(self.cookie_name()).map(|c| c.value().to_string()).unwrap_or_default();
        let max_age = cookie::time::Duration::seconds((ends_at - now.timestamp()).max(0));
        self.header(Cookie::build((self.cookie_name(), signed)).max_age(max_age))
    }

    /// The `Set-Cookie` value that ends the session in the browser.
    pub(crate) fn close(&self) -> HeaderValue {
        self.header(Cookie::build((self.cookie_name(), "")).max_age(cookie::time::Duration::ZERO))
    }

    fn header(&self, cookie: cookie::CookieBuilder<'static>) -> HeaderValue {
        // `__Host-` cookies must be `Secure`, for path `/` and without a domain.
        let path = if self.secure { "/" } else { COOKIE_PATH };
        let cookie = cookie.path(path).http_only(true).same_site(SameSite::Strict).secure(self.secure).build();
        // Names, signed values (base64 and `[0-9a-z._-]`) and attributes are visible ASCII.
        HeaderValue::from_str(&cookie.to_string()).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// What the request's session says, if it is signed with this key and has not ended at
    /// `now`.
    pub(crate) fn claims_of(&self, headers: &HeaderMap, now: DateTime<Utc>) -> Result<SessionClaims, NoSession> {
        let name = self.cookie_name();
        let mut jar = CookieJar::new();
        let presented = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(Cookie::split_parse)
            .filter_map(Result::ok)
            .find(|cookie| cookie.name() == name && !cookie.value().is_empty())
            .ok_or(NoSession::Absent)?;
        jar.add_original(presented.into_owned());
        let verified = jar.signed(&self.key).get(name).ok_or(NoSession::Forged)?;
        let mut parts = verified.value().splitn(4, '.');
        let mut next = || parts.next().ok_or(NoSession::Forged);
        let ends_at: i64 = next()?.parse().map_err(|_| NoSession::Forged)?;
        let opened_at: i64 = next()?.parse().map_err(|_| NoSession::Forged)?;
        let credential = next()?.to_string();
        let principal = next()?.to_string();
        if now.timestamp() >= ends_at {
            return Err(NoSession::Expired);
        }
        let opened_at = DateTime::from_timestamp(opened_at, 0).ok_or(NoSession::Forged)?;
        Ok(SessionClaims { principal, opened_at, credential })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::principals::token_digest;

    fn token(token: &str) -> Credential {
        Credential::Token { digest: token_digest(token) }
    }

    fn request_with(set_cookie: &HeaderValue) -> HeaderMap {
        // A browser sends back the name=value part of Set-Cookie.
        let pair = set_cookie.to_str().unwrap().split(';').next().unwrap().to_string();
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_str(&format!("other=1; {pair}")).unwrap());
        headers
    }

    #[test]
    fn a_session_names_its_principal_until_it_ends() {
        let sessions = ConsoleSessions::new(Some(&[7u8; 32]), Duration::from_secs(3600), true);
        let now = Utc::now();
        let set_cookie = sessions.open("acme", &token("fbq_acme"), now);
        let text = set_cookie.to_str().unwrap();
        for attribute in
            ["__Host-filament_session=", "HttpOnly", "SameSite=Strict", "Secure", "Path=/;", "Max-Age=3600"]
        {
            assert!(text.contains(attribute), "{attribute} missing from {text}");
        }
        assert!(!text.contains("fbq_") && !text.contains(&hex::encode(token_digest("fbq_acme"))), "{text}");
        let headers = request_with(&set_cookie);
        let claims = sessions.claims_of(&headers, now).unwrap();
        assert_eq!((claims.principal.as_str(), claims.opened_at.timestamp()), ("acme", now.timestamp()));
        assert_eq!(claims.credential, token("fbq_acme").fingerprint());
        assert_eq!(sessions.claims_of(&headers, now + chrono::Duration::seconds(3600)), Err(NoSession::Expired));
    }

    #[test]
    fn a_session_of_another_key_or_altered_is_refused() {
        let sessions = ConsoleSessions::new(Some(&[7u8; 32]), Duration::from_secs(3600), false);
        let other = ConsoleSessions::new(Some(&[8u8; 32]), Duration::from_secs(3600), false);
        let now = Utc::now();
        let set_cookie = other.open("acme", &token("fbq_acme"), now);
        let text = set_cookie.to_str().unwrap();
        assert!(!text.contains("Secure") && text.starts_with("filament_session=") && text.contains("Path=/ui/"));
        assert_eq!(sessions.claims_of(&request_with(&set_cookie), now), Err(NoSession::Forged));
        let genuine = sessions.open("acme", &token("fbq_acme"), now);
        let altered = HeaderValue::from_str(&genuine.to_str().unwrap().replace(".acme", ".root")).unwrap();
        assert_eq!(sessions.claims_of(&request_with(&altered), now), Err(NoSession::Forged));
        assert_eq!(sessions.claims_of(&HeaderMap::new(), now), Err(NoSession::Absent));
        assert_eq!(sessions.claims_of(&request_with(&sessions.close()), now), Err(NoSession::Absent));
    }

    #[test]
    fn a_session_opened_with_an_id_token_ends_when_the_token_would() {
        let sessions = ConsoleSessions::new(Some(&[7u8; 32]), Duration::from_secs(8 * 3600), false);
        let now = Utc::now();
        let expires = u64::try_from(now.timestamp()).unwrap() + 3600;
        let account =
            Credential::ServiceAccount { email: "a@p.iam.gserviceaccount.com".into(), expires_at_unix_secs: expires };
        let headers = request_with(&sessions.open("acme", &account, now));
        assert!(sessions.claims_of(&headers, now + chrono::Duration::seconds(3599)).is_ok());
        assert_eq!(sessions.claims_of(&headers, now + chrono::Duration::seconds(3600)), Err(NoSession::Expired));
    }

    #[test]
    fn a_session_stands_only_while_its_credential_is_listed_and_the_operator_has_not_ended_it() {
        let sessions = ConsoleSessions::new(Some(&[7u8; 32]), Duration::from_secs(3600), false);
        let now = Utc::now();
        let claims = sessions.claims_of(&request_with(&sessions.open("acme", &token("fbq_old"), now)), now).unwrap();
        let mut principal = Principal::default_with_tokens(&["fbq_old".to_string()]);
        assert_eq!(claims.check(&principal), Ok(()));
        principal.sessions_not_before = Some(now + chrono::Duration::seconds(1));
        assert_eq!(claims.check(&principal), Err(SessionRevoked::EndedByOperator));
        principal.sessions_not_before = Some(now - chrono::Duration::seconds(1));
        assert_eq!(claims.check(&principal), Ok(()), "opened after it");
        principal.token_sha256 = vec![token_digest("fbq_new")];
        assert_eq!(claims.check(&principal), Err(SessionRevoked::CredentialRemoved), "a rotated token");
        let email = "a@p.iam.gserviceaccount.com".to_string();
        let account = Credential::ServiceAccount { email: email.clone(), expires_at_unix_secs: u64::MAX };
        let claims = sessions.claims_of(&request_with(&sessions.open("acme", &account, now)), now).unwrap();
        principal.google_service_accounts = vec![email];
        assert_eq!(claims.check(&principal), Ok(()));
        principal.google_service_accounts.clear();
        assert_eq!(claims.check(&principal), Err(SessionRevoked::CredentialRemoved), "a removed service account");
    }
}
