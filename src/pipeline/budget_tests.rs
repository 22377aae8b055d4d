use super::*;

#[tokio::test(start_paused = true)]
async fn waits_then_answers_backpressure_and_releases_on_drop() {
    let budget = ByteBudget::new(10 * 1024, "the upload budget");
    let held = budget.acquire(8 * 1024, None, Duration::from_secs(1)).await.unwrap();
    assert_eq!(budget.in_use_bytes(), 8 * 1024);
    let problem = budget.acquire(4 * 1024, None, Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(problem.code, ErrorCode::Backpressure);
    assert_eq!(problem.retry_after_secs, Some(2));
    let waiter = tokio::spawn({
        let budget = budget.clone();
        async move { budget.acquire(4 * 1024, None, Duration::from_secs(5)).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(held);
    assert!(waiter.await.unwrap().is_ok());
    assert_eq!(budget.in_use_bytes(), 0);
    assert_eq!(
        budget.acquire(11 * 1024, None, Duration::from_secs(1)).await.unwrap_err().code,
        ErrorCode::PayloadTooLarge
    );
}

/// A request holding part of the budget that needs more than the rest of all of it is
/// refused at once with 413, not kept waiting for room only it could free.
#[tokio::test(start_paused = true)]
async fn more_than_all_of_it_in_steps_is_refused_at_once() {
    let budget = ByteBudget::new(10 * 1024, "the receive budget");
    let held = budget.acquire(8 * 1024, None, Duration::from_secs(1)).await.unwrap();
    assert!(budget.refuse_more_than_capacity(&held, 2 * 1024).is_ok());
    let problem = budget.refuse_more_than_capacity(&held, 3 * 1024).unwrap_err();
    assert_eq!(problem.code, ErrorCode::PayloadTooLarge);
    assert!(problem.detail.contains("11264 bytes of the receive budget"), "{}", problem.detail);
}

/// A frame charged while the budget has room takes it at once, without waiting, and gives
/// it back when dropped (HTTP/2 took it).
#[tokio::test(start_paused = true)]
async fn a_frame_takes_free_room_at_once_and_gives_it_back_when_taken() {
    let budget = ByteBudget::new(10 * 1024, "the upload budget");
    let frame = budget.charge_frame(4 * 1024);
    assert_eq!(budget.in_use_bytes(), 4 * 1024);
    let refused = budget.acquire(8 * 1024, None, Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::Backpressure);
    drop(frame);
    assert_eq!(budget.in_use_bytes(), 0);
    assert!(budget.acquire(8 * 1024, None, Duration::from_secs(1)).await.is_ok());
}

/// A frame charged while the budget is full is owed: the bytes released next pay it before
/// a waiting request gets them, and once the frame is taken everything comes back.
#[tokio::test(start_paused = true)]
async fn a_frame_charged_while_full_is_paid_by_the_next_bytes_released() {
    let budget = ByteBudget::new(10 * 1024, "the upload budget");
    let payload = budget.acquire(10 * 1024, None, Duration::from_secs(1)).await.unwrap();
    let frame = budget.charge_frame(4 * 1024);
    assert_eq!(budget.in_use_bytes(), 14 * 1024, "the payload and the owed frame");
    let waiter = tokio::spawn({
        let budget = budget.clone();
        async move { budget.acquire(8 * 1024, None, Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(payload);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(budget.debt.owed_units(), 0, "4 KiB of the payload paid the frame");
    assert!(!waiter.is_finished(), "8 KiB do not fit beside the frame");
    drop(frame);
    let granted = waiter.await.unwrap().expect("room once the frame is taken");
    assert_eq!(budget.in_use_bytes(), 8 * 1024);
    drop(granted);
    assert_eq!(budget.in_use_bytes(), 0);
    assert_eq!(budget.semaphore.available_permits(), 10, "nothing lost");
}

/// A frame taken before its debt was paid owes nothing more: the payload's release later
/// gives all of its bytes back.
#[tokio::test]
async fn a_frame_taken_before_it_was_paid_owes_nothing() {
    let budget = ByteBudget::new(10 * 1024, "the upload budget");
    let payload = budget.acquire(8 * 1024, None, Duration::from_secs(1)).await.unwrap();
    let frame = budget.charge_frame(4 * 1024);
    assert_eq!((budget.semaphore.available_permits(), budget.debt.owed_units()), (0, 2));
    drop(frame);
    assert_eq!((budget.semaphore.available_permits(), budget.debt.owed_units()), (2, 0));
    drop(payload);
    assert_eq!(budget.semaphore.available_permits(), 10);
    assert_eq!(budget.in_use_bytes(), 0);
}

/// A request waiting for its full share presses that resource's lane only; one waiting for
/// the full budget presses every lane; the count drops when the wait ends.
#[tokio::test(start_paused = true)]
async fn waiting_requests_press_what_they_wait_for() {
    let budget = ByteBudget::new(40 * 1024, "the upload budget");
    let (slow, fast) = (ResourceShare::new(20 * 1024), ResourceShare::new(30 * 1024));
    let (budget_waiters, slow_waiters) = (budget.pressure().subscribe(), slow.pressure().subscribe());
    let _slow_held = budget.acquire(20 * 1024, Some(&slow), Duration::from_secs(1)).await.unwrap();
    let waiting_for_share = tokio::spawn({
        let (budget, slow) = (budget.clone(), slow.clone());
        async move { budget.acquire(1024, Some(&slow), Duration::from_secs(1)).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!((*budget_waiters.borrow(), *slow_waiters.borrow()), (0, 1));
    assert!(waiting_for_share.await.unwrap().is_err());
    assert_eq!(*slow_waiters.borrow(), 0);

    let _fast_held = budget.acquire(20 * 1024, Some(&fast), Duration::from_secs(1)).await.unwrap();
    let waiting_for_budget = tokio::spawn({
        let (budget, fast) = (budget.clone(), fast.clone());
        async move { budget.acquire(5 * 1024, Some(&fast), Duration::from_secs(1)).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!((*budget_waiters.borrow(), *slow_waiters.borrow()), (1, 0));
    assert!(waiting_for_budget.await.unwrap().is_err());
    assert_eq!(*budget_waiters.borrow(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_share_waits_while_other_resources_keep_the_budget() {
    let budget = ByteBudget::new(100 * 1024, "the upload budget");
    let (slow, fast) = (ResourceShare::new(20 * 1024), ResourceShare::new(20 * 1024));
    let mut held = budget.acquire(20 * 1024, Some(&slow), Duration::from_secs(1)).await.unwrap();
    let refused = budget.acquire(1024, Some(&slow), Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::Backpressure);
    assert!(budget.acquire(20 * 1024, Some(&fast), Duration::from_secs(1)).await.is_ok());
    // A batch above the whole share takes what the share has, and splits consistently.
    drop(held.split(20 * 1024));
    let mut big = budget.acquire(30 * 1024, Some(&slow), Duration::from_secs(1)).await.unwrap();
    assert_eq!(slow.semaphore.available_permits(), 0);
    drop(big.split(15 * 1024));
    assert_eq!(slow.semaphore.available_permits(), 15);
    drop(big);
    assert_eq!(slow.semaphore.available_permits(), 20);
    drop(held);
}

#[tokio::test]
async fn permits_split_and_merge_without_losing_bytes() {
    let budget = ByteBudget::new(100 * 1024, "the upload budget");
    let mut whole = budget.acquire(10 * 1024, None, Duration::from_secs(1)).await.unwrap();
    let part = whole.split(3 * 1024);
    assert_eq!(budget.in_use_bytes(), 10 * 1024);
    drop(part);
    assert_eq!(budget.in_use_bytes(), 7 * 1024);
    let other = budget.acquire(1024, None, Duration::from_secs(1)).await.unwrap();
    whole.merge(other);
    drop(whole);
    assert_eq!(budget.in_use_bytes(), 0);
}
