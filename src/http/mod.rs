//! Connection supervision, beneath the handlers: how the gateway's listener serves HTTP/1.1 and
//! HTTP/2 (hyper-util), and what a connection, a request body or an answer may cost it. Requests
//! go next to the axum router `api` builds, which `app` hands to [`server::serve`]; nothing
//! here imports a handler.
//!
//! - [`server`]: the accept loop and one connection's limits (`server/activity.rs` the
//!   deadlines, `server/tracked.rs` what the stream, router and bodies report);
//! - [`http2_frames`]: the DATA payload in the HTTP/2 frames a connection writes;
//! - [`body_deadline`]: the minimum rate a request body arrives at (408 `body_timeout`);
//! - [`early_answer`]: an answer given before the body was read still reaches the client;
//! - [`tls`]: HTTPS in process (certificate reloads) and the forwarding client's TLS.

pub(crate) mod body_deadline;
pub(crate) mod early_answer;
mod http2_frames;
pub(crate) mod server;
pub(crate) mod tls;
