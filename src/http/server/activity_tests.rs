//! The connection limits' clock, with paused time.

use std::sync::Arc;
use std::time::Duration;

use axum::http::Version;

use super::super::{
    MIN_HTTP1_HEADER_FIELDS_PARSED, MIN_HTTP1_READ_BUFFER_BYTES, http1_header_fields_parsed, http1_read_buffer_bytes,
    test_limits,
};
use super::*;
use crate::http::server::connections::OpenConnections;

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

/// An HTTP/2 frame of `kind` with `payload` (RFC 9113, section 4.1).
fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let length = payload.len();
    let mut frame = vec![(length >> 16) as u8, (length >> 8) as u8, length as u8, kind, 0, 0, 0, 0, 1];
    frame.extend_from_slice(payload);
    frame
}

#[tokio::test(start_paused = true)]
async fn idle_connections_and_slow_heads_time_out_open_requests_never() {
    let activity = Activity::new(test_limits());
    assert_eq!(activity.deadline(), Some(activity.lock().waiting_since + Duration::from_secs(60)));
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(activity.expired(), Some(CloseReason::IdleTimeout));
    activity.read();
    assert_eq!(activity.expired(), None, "a head has started: it has ten seconds");
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(activity.expired(), Some(CloseReason::HeaderTimeout));
    activity.request_opened(Version::HTTP_11);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(activity.deadline(), None, "an open request never times out here");
    activity.request_closed();
    assert_eq!(activity.expired(), None, "idle again, from now");
}

#[tokio::test(start_paused = true)]
async fn http2_frames_between_requests_are_idleness_however_the_preface_arrived() {
    let activity = Activity::new(test_limits());
    // The preface in two reads: nothing is guessed from them, the first request tells.
    activity.read();
    activity.read();
    activity.request_opened(Version::HTTP_2);
    activity.request_closed();
    activity.read();
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(activity.expired(), None, "a ping is not a slow head");
    tokio::time::advance(Duration::from_secs(50)).await;
    assert_eq!(activity.expired(), Some(CloseReason::IdleTimeout));
}

#[tokio::test(start_paused = true)]
async fn a_pending_response_hyper_never_asks_for_times_out() {
    let activity = Activity::new(test_limits());
    activity.request_opened(Version::HTTP_2);
    assert_eq!(activity.deadline(), None, "a handler at work has no deadline here");
    // A body of unknown length: nothing announced, nothing unsent yet.
    activity.response_started(0);
    tokio::time::advance(Duration::from_secs(29)).await;
    activity.response_progressed();
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(activity.expired(), None, "its body was asked for 29 s ago");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(activity.expired(), Some(CloseReason::SendRate), "an HTTP/2 window held at zero");
}

#[tokio::test(start_paused = true)]
async fn http2_data_trickling_out_is_judged_by_its_rate_not_by_its_progress() {
    let activity = Activity::new(test_limits());
    let mut frames = DataFrameCounter::default();
    activity.written(&frame(0x4, &[0; 6]), &mut frames);
    activity.request_opened(Version::HTTP_2);
    activity.response_started(100_000);
    activity.body_handed_over(100_000, 100_000);
    activity.response_ended(0, 0);
    activity.request_closed();
    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(5)).await;
        // A WINDOW_UPDATE of 1 let one byte out, and a ping was answered.
        activity.written(&[frame(0x0, b"x"), frame(0x6, &[0; 8])].concat(), &mut frames);
        assert_eq!(activity.expired(), None);
    }
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(activity.expired(), Some(CloseReason::SendRate), "5 bytes of the 30 KiB owed");
    assert!(CloseReason::SendRate.is_abrupt());
}

#[tokio::test(start_paused = true)]
async fn http1_answers_count_every_byte_written_and_nothing_once_flushed() {
    let activity = Activity::new(test_limits());
    let mut frames = DataFrameCounter::default();
    activity.read();
    activity.request_opened(Version::HTTP_11);
    activity.response_started(200_000);
    activity.body_handed_over(200_000, 200_000);
    activity.written(&[b'x'; 100_000], &mut frames);
    activity.write_blocked(true);
    assert_eq!(activity.idle_since(), None, "bytes unsent");
    activity.response_ended(0, 0);
    activity.request_closed();
    tokio::time::advance(Duration::from_secs(31)).await;
    assert_eq!(activity.expired(), None, "its first window sent 100 KB");
    tokio::time::advance(Duration::from_secs(31)).await;
    assert_eq!(activity.expired(), Some(CloseReason::SendRate), "the socket took nothing in the next");
    let activity = Activity::new(test_limits());
    activity.request_opened(Version::HTTP_11);
    activity.response_started(200_000);
    activity.body_handed_over(200_000, 200_000);
    activity.response_ended(0, 0);
    activity.request_closed();
    activity.flushed();
    assert!(activity.idle_since().is_some(), "flushed: the answer left");
}

#[tokio::test(start_paused = true)]
async fn a_connection_holding_its_unsent_allowance_closes_at_its_next_answer() {
    let activity = Activity::new(test_limits());
    activity.request_opened(Version::HTTP_2);
    for _ in 0..3 {
        activity.response_started(115_000);
        assert_eq!(activity.expired(), None);
    }
    activity.response_started(115_000);
    assert_eq!(activity.expired(), Some(CloseReason::UnsentBytes));
}

#[tokio::test(start_paused = true)]
async fn the_accept_loop_closes_the_longest_idle_and_caps_each_peer() {
    let open = OpenConnections::new(test_limits().max_connections_per_peer);
    let peer: std::net::SocketAddr = "192.0.2.1:1000".parse().unwrap();
    let (older, busy) = (Arc::new(Activity::new(test_limits())), Arc::new(Activity::new(test_limits())));
    let older_place = open.admit(peer).expect("the first");
    older_place.served(Arc::clone(&older));
    tokio::time::advance(Duration::from_secs(1)).await;
    let newer = Arc::new(Activity::new(test_limits()));
    let newer_place = open.admit(peer).expect("the second");
    newer_place.served(Arc::clone(&newer));
    assert!(open.admit(peer).is_none(), "a third from the same peer");
    let waiting = open.admit("192.0.2.3:1".parse().unwrap()).expect("a connection waiting for its place");
    let busy_place = open.admit("192.0.2.2:1".parse().unwrap()).expect("another peer");
    busy_place.served(Arc::clone(&busy));
    busy.request_opened(Version::HTTP_11);
    assert!(open.close_longest_idle());
    assert_eq!(older.expired(), Some(CloseReason::IdleAtCapacity));
    assert_eq!(newer.expired(), None);
    drop(newer_place);
    assert!(open.admit(peer).is_some(), "a place given back");
    drop(waiting);
}
