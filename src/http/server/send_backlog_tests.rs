//! The send accounting, on a clock the tests move by hand.

use super::*;

const LIMITS: SendLimits =
    SendLimits { max_unsent_bytes: 256 * 1024, min_rate_bytes_per_sec: 1024, window: Duration::from_secs(30) };

fn secs(start: Instant, seconds: u64) -> Instant {
    start + Duration::from_secs(seconds)
}

#[test]
fn a_peer_taking_a_byte_now_and_then_is_judged_by_rate_not_by_progress() {
    let start = Instant::now();
    let mut backlog = SendBacklog::new(LIMITS);
    backlog.answer_started(100 * 1024, start);
    backlog.handed_over(100 * 1024, 100 * 1024, start);
    for second in (1..30).step_by(5) {
        backlog.written(1, secs(start, second));
        assert_eq!(backlog.judge(secs(start, second)), None, "within the first window");
    }
    assert_eq!(backlog.deadline(secs(start, 29)), Some(secs(start, 30)));
    assert_eq!(backlog.judge(secs(start, 30)), Some(SendVerdict::SendRate), "6 bytes of the 30 KiB owed");
}

#[test]
fn a_slow_reader_above_the_rate_keeps_its_connection_window_after_window() {
    let start = Instant::now();
    let mut backlog = SendBacklog::new(LIMITS);
    backlog.answer_started(4 * 1024 * 1024, start);
    backlog.handed_over(4 * 1024 * 1024, 4 * 1024 * 1024, start);
    for second in 1..=120 {
        backlog.written(2 * 1024, secs(start, second));
        assert_eq!(backlog.judge(secs(start, second)), None, "2 KiB a second, at second {second}");
    }
}

#[test]
fn a_window_owes_at_most_what_was_unsent_when_it_opened() {
    let start = Instant::now();
    let mut backlog = SendBacklog::new(LIMITS);
    backlog.answer_started(300, start);
    backlog.handed_over(300, 300, start);
    backlog.written(299, secs(start, 29));
    assert_eq!(backlog.judge(secs(start, 30)), Some(SendVerdict::SendRate), "one byte short");
    let mut backlog = SendBacklog::new(LIMITS);
    backlog.answer_started(300, start);
    backlog.handed_over(300, 300, start);
    backlog.written(300, secs(start, 29));
    assert!(backlog.is_empty());
    assert_eq!(backlog.deadline(secs(start, 29)), None, "all sent: no window");
}

#[test]
fn a_write_the_socket_does_not_take_owes_at_least_a_byte() {
    let start = Instant::now();
    let mut backlog = SendBacklog::new(LIMITS);
    backlog.write_blocked(true, start);
    backlog.write_blocked(true, secs(start, 20));
    assert_eq!(backlog.judge(secs(start, 30)), Some(SendVerdict::SendRate));
}

#[test]
fn an_answer_produced_and_never_asked_for_counts_from_its_size_hint() {
    let start = Instant::now();
    let mut backlog = SendBacklog::new(LIMITS);
    backlog.answer_started(10_000, start);
    assert_eq!(backlog.unsent_bytes(), 10_000);
    assert_eq!(backlog.judge(secs(start, 30)), Some(SendVerdict::SendRate), "an HTTP/2 window held at zero");
}

#[test]
fn a_connection_holding_its_allowance_may_not_start_another_answer() {
    let start = Instant::now();
    let mut backlog = SendBacklog::new(LIMITS);
    backlog.answer_started(1024 * 1024, start);
    assert_eq!(backlog.judge(start), None, "one answer larger than the allowance goes");
    backlog.answer_started(10, start);
    assert_eq!(backlog.deadline(start), Some(start));
    assert_eq!(backlog.judge(start), Some(SendVerdict::UnsentBytes));
}

#[test]
fn answers_sent_or_dropped_leave_nothing_owed() {
    let start = Instant::now();
    let mut backlog = SendBacklog::new(LIMITS);
    backlog.answer_started(1000, start);
    backlog.handed_over(600, 600, start);
    backlog.written(100, start);
    // The stream was reset: hyper drops the body and what it buffered of it.
    backlog.answer_dropped(400, 600, start);
    assert!(backlog.is_empty(), "{backlog:?}");
    backlog.answer_started(1000, start);
    backlog.handed_over(1000, 1000, start);
    backlog.written(200, start);
    backlog.flushed(start);
    assert!(backlog.is_empty(), "HTTP/1 flushed: hyper holds nothing");
}
