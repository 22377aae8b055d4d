//! The connection limits' clock, with paused time.

use std::time::Duration;

use super::super::{
    ConnectionLimits, MIN_HTTP1_HEADER_FIELDS_PARSED, MIN_HTTP1_READ_BUFFER_BYTES, http1_header_fields_parsed,
    http1_read_buffer_bytes,
};
use super::*;

#[test]
fn the_read_buffer_fits_the_request_head_limits() {
    assert_eq!(http1_read_buffer_bytes(4096, 16 * 1024), MIN_HTTP1_READ_BUFFER_BYTES);
    assert_eq!(http1_read_buffer_bytes(4096, 60 * 1024), 2 * (4096 + 60 * 1024));
}

#[test]
fn the_parser_takes_one_header_field_beyond_the_count_limit_and_at_least_its_minimum() {
    assert_eq!(http1_header_fields_parsed(100), MIN_HTTP1_HEADER_FIELDS_PARSED);
    assert_eq!(http1_header_fields_parsed(10_000), 10_001);
}

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        read_buffer_bytes: MIN_HTTP1_READ_BUFFER_BYTES,
        http1_header_fields_parsed: MIN_HTTP1_HEADER_FIELDS_PARSED,
        max_connections: 1,
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        write_timeout: Duration::from_secs(30),
        shutdown_wait: Duration::from_secs(30),
        max_header_list_bytes: 16 * 1024,
    }
}

#[tokio::test(start_paused = true)]
async fn idle_connections_and_slow_heads_time_out_open_requests_never() {
    let activity = Activity::new();
    assert_eq!(activity.deadline(&limits()), Some(activity.lock().waiting_since + Duration::from_secs(60)));
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(activity.expired(&limits()), Some("idle_timeout"));
    activity.read(b"GET / HTTP/1.1\r\n");
    assert_eq!(activity.expired(&limits()), None, "a head has started: it has ten seconds");
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(activity.expired(&limits()), Some("header_timeout"));
    activity.request_opened();
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(activity.deadline(&limits()), None, "an open request never times out here");
    activity.request_closed();
    assert_eq!(activity.expired(&limits()), None, "idle again, from now");
}

#[tokio::test(start_paused = true)]
async fn http2_frames_without_a_request_are_idleness() {
    let activity = Activity::new();
    activity.read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    activity.read(b"ping");
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(activity.expired(&limits()), None, "not a slow head");
    tokio::time::advance(Duration::from_secs(50)).await;
    assert_eq!(activity.expired(&limits()), Some("idle_timeout"));
}

#[tokio::test(start_paused = true)]
async fn a_pending_response_that_makes_no_progress_times_out() {
    let activity = Activity::new();
    activity.read(b"GET /healthz HTTP/1.1\r\n\r\n");
    activity.request_opened();
    assert_eq!(activity.deadline(&limits()), None, "a handler at work has no deadline here");
    activity.response_started();
    tokio::time::advance(Duration::from_secs(29)).await;
    activity.response_progressed();
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(activity.expired(&limits()), None, "its body was read for sending 29 s ago");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(activity.expired(&limits()), Some("write_timeout"), "an HTTP/2 body never read for sending");
    activity.response_ended();
    activity.request_closed();
    assert_eq!(activity.expired(&limits()), None, "sent: idle from now");
}

#[tokio::test(start_paused = true)]
async fn a_write_the_socket_does_not_take_times_out_whatever_the_requests() {
    let activity = Activity::new();
    activity.read(b"GET /openapi.json HTTP/1.1\r\n\r\n");
    activity.request_opened();
    activity.response_started();
    activity.response_progressed();
    activity.response_ended();
    activity.request_closed();
    // The body was handed over whole; its bytes wait in the write buffer for a peer that
    // reads nothing (a pipelined request is behind it, unread).
    activity.write_blocked(true);
    tokio::time::advance(Duration::from_secs(20)).await;
    activity.write_blocked(true);
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(activity.expired(&limits()), Some("write_timeout"), "before the 60 s idle timeout");
    activity.write_blocked(false);
    assert_eq!(activity.expired(&limits()), None, "the socket took bytes again");
}
