//! The execution page's phase chart (issue 58): each resource's phases of the current delivery
//! (set-up, upload, stream commit, plan, publication) as bars on one time axis, drawn as
//! server-rendered SVG from the timeline's events, with the plan's bytes and cost beside each
//! table. Pure: events and the plan in, markup out ([`super::pages::execution`] places it).
//!
//! Where each bar starts and ends, from the events:
//! - set-up: `set_up_finished` at its end, `duration_ms` before it;
//! - upload: from the end of set-up to `commit_started` (extraction: batches arriving and
//!   uploading);
//! - stream commit: from `commit_started` to the resource's `stream_committed` (drain,
//!   finalize, commit);
//! - plan: from the barrier (the delivery's last `stream_committed`, else `commit_started`) to
//!   the resource's `planned`;
//! - publication: from its first `publication_started` (its job id recorded, before it waits
//!   for a turn under the adaptive publication limit) to its last `publication_finished` or
//!   `publication_failed`.
//!
//! A phase whose events are not (yet) there draws no bar.

use chrono::{DateTime, Utc};
use maud::{Markup, html};

use crate::api::views::PlanView;
use crate::store::{EventKind, EventRecord};

/// The phases, in the order a resource goes through them, with their bar colour.
const PHASES: [(Phase, &str); 5] = [
    (Phase::SetUp, "#8c8c8c"),
    (Phase::Upload, "#4a7bd0"),
    (Phase::StreamCommit, "#2e9e6b"),
    (Phase::Plan, "#d09a2e"),
    (Phase::Publication, "#b04a9e"),
];

/// Width of the time axis and of the label and figure columns, and a row's height, in SVG
/// user units.
const AXIS_WIDTH: f64 = 480.0;
const LABEL_WIDTH: f64 = 160.0;
const FIGURES_WIDTH: f64 = 220.0;
const ROW_HEIGHT: f64 = 18.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    SetUp,
    Upload,
    StreamCommit,
    Plan,
    Publication,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::SetUp => "set-up",
            Phase::Upload => "upload",
            Phase::StreamCommit => "stream commit",
            Phase::Plan => "plan",
            Phase::Publication => "publication",
        }
    }
}

/// One bar: a resource's phase, from `start` to `end`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Bar {
    pub(super) phase: Phase,
    pub(super) start: DateTime<Utc>,
    pub(super) end: DateTime<Utc>,
}

/// Each resource's bars (resources in the order their first event came), from the events of
/// `delivery`.
pub(super) fn phase_bars(events: &[EventRecord], delivery: i32) -> Vec<(String, Vec<Bar>)> {
    let events: Vec<&EventRecord> = events.iter().filter(|e| e.delivery == delivery).collect();
    let first = |kind: EventKind, resource: Option<&str>| {
        events.iter().find(|e| e.kind == kind && e.resource.as_deref() == resource).map(|e| e.at)
    };
    let last = |kinds: &[EventKind], resource: &str| {
        events.iter().rev().find(|e| kinds.contains(&e.kind) && e.resource.as_deref() == Some(resource)).map(|e| e.at)
    };
    let commit_started = first(EventKind::CommitStarted, None);
    let barrier = events.iter().rev().find(|e| e.kind == EventKind::StreamCommitted).map(|e| e.at).or(commit_started);
    let mut resources: Vec<&str> = Vec::new();
    for resource in events.iter().filter_map(|e| e.resource.as_deref()) {
        if !resources.contains(&resource) {
            resources.push(resource);
        }
    }
    resources
        .into_iter()
        .map(|resource| {
            let set_up =
                events.iter().find(|e| e.kind == EventKind::SetUpFinished && e.resource.as_deref() == Some(resource));
            let set_up_end = set_up.map(|e| e.at);
            let set_up_start = set_up.and_then(|e| {
                let ms = e.detail["duration_ms"].as_i64()?;
                Some(e.at - chrono::Duration::milliseconds(ms))
            });
            let spans = [
                (Phase::SetUp, set_up_start, set_up_end),
                (Phase::Upload, set_up_end, commit_started),
                (Phase::StreamCommit, commit_started, first(EventKind::StreamCommitted, Some(resource))),
                (Phase::Plan, barrier, first(EventKind::Planned, Some(resource))),
                (
                    Phase::Publication,
                    first(EventKind::PublicationStarted, Some(resource)),
                    last(&[EventKind::PublicationFinished, EventKind::PublicationFailed], resource),
                ),
            ];
            let bars = spans
                .into_iter()
                .filter_map(|(phase, start, end)| Some(Bar { phase, start: start?, end: end? }))
                .filter(|bar| bar.end >= bar.start)
                .collect();
            (resource.to_string(), bars)
        })
        .filter(|(_, bars): &(String, Vec<Bar>)| !bars.is_empty())
        .collect()
}

/// The chart: a legend, then one row per resource with its bars on the shared time axis and
/// the plan's bytes and estimated cost for its table at the right. Nothing when no phase has
/// begun and ended yet.
pub(super) fn phase_chart(events: &[EventRecord], delivery: i32, plan: Option<&PlanView>) -> Markup {
    let rows = phase_bars(events, delivery);
    let Some(origin) = rows.iter().flat_map(|(_, bars)| bars.iter().map(|b| b.start)).min() else { return html! {} };
    let end = rows.iter().flat_map(|(_, bars)| bars.iter().map(|b| b.end)).max().unwrap_or(origin);
    let span_ms = (end - origin).num_milliseconds().max(1) as f64;
    let x = |at: DateTime<Utc>| LABEL_WIDTH + (at - origin).num_milliseconds() as f64 * AXIS_WIDTH / span_ms;
    let width = LABEL_WIDTH + AXIS_WIDTH + FIGURES_WIDTH;
    let height = ROW_HEIGHT * (rows.len() as f64 + 2.0);
    html! {
        h2 { "Phases" }
        p.legend { @for (phase, colour) in PHASES {
            svg width="10" height="10" { rect width="10" height="10" fill=(colour) {} } " " (phase.as_str()) " "
        } }
        svg #phases width=(width) height=(height) viewBox={ "0 0 " (width) " " (height) } role="img"
            aria-label="each resource's phases on one time axis" {
            @for (row, (resource, bars)) in rows.iter().enumerate() {
                @let y = ROW_HEIGHT * row as f64;
                g.phase-row data-resource=(resource) {
                    text x="0" y=(y + 13.0) font-size="12" { (resource) }
                    @for bar in bars {
                        @let colour = PHASES.iter().find(|(phase, _)| *phase == bar.phase).map_or("#000", |(_, c)| *c);
                        @let duration_ms = (bar.end - bar.start).num_milliseconds();
                        rect.phase data-phase=(bar.phase.as_str()) x=(x(bar.start)) y=(y + 3.0)
                            width=((x(bar.end) - x(bar.start)).max(1.0)) height=(ROW_HEIGHT - 6.0) fill=(colour) {
                            title { (bar.phase.as_str()) ": " (duration_ms) " ms" }
                        }
                    }
                    @if let Some(figures) = plan.and_then(|plan| planned_figures(plan, resource)) {
                        text.plan-figures x=(LABEL_WIDTH + AXIS_WIDTH + 8.0) y=(y + 13.0) font-size="12" { (figures) }
                    }
                }
            }
            @let axis_y = ROW_HEIGHT * rows.len() as f64 + 4.0;
            line x1=(LABEL_WIDTH) y1=(axis_y) x2=(LABEL_WIDTH + AXIS_WIDTH) y2=(axis_y) stroke="#555" {}
            text x=(LABEL_WIDTH) y=(axis_y + 14.0) font-size="11" { "0 s" }
            text x=(LABEL_WIDTH + AXIS_WIDTH) y=(axis_y + 14.0) font-size="11" text-anchor="end" {
                (format!("{:.1} s", span_ms / 1000.0))
            }
        }
    }
}

/// `<bytes> B · $<cost>` of the resource's planned publication, or why it is unpriced.
fn planned_figures(plan: &PlanView, resource: &str) -> Option<String> {
    let planned = plan.publications.iter().find(|p| p.priced.resource == resource)?;
    Some(match (planned.priced.bytes_processed, planned.estimated_cost_usd) {
        (Some(bytes), Some(cost)) => format!("{} · {bytes} B · ${cost:.6}", planned.priced.table),
        _ => format!("{} · unpriced", planned.priced.table),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn event(seconds: i64, kind: EventKind, resource: Option<&str>, detail: Value) -> EventRecord {
        EventRecord {
            event_id: seconds,
            delivery: 1,
            at: DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap(),
            kind,
            resource: resource.map(str::to_string),
            count: 1,
            detail,
        }
    }

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    #[test]
    fn each_phase_spans_the_events_that_bound_it() {
        let events = vec![
            event(0, EventKind::DeliveryStarted, None, json!({})),
            event(2, EventKind::SetUpFinished, Some("a"), json!({"duration_ms": 1500})),
            event(10, EventKind::CommitStarted, None, json!({})),
            event(12, EventKind::StreamCommitted, Some("a"), json!({})),
            event(13, EventKind::StreamCommitted, Some("b"), json!({})),
            event(14, EventKind::Planned, Some("a"), json!({})),
            event(15, EventKind::PublicationStarted, Some("a"), json!({})),
            event(16, EventKind::PublicationFailed, Some("a"), json!({})),
            event(17, EventKind::PublicationStarted, Some("a"), json!({})),
            event(19, EventKind::PublicationFinished, Some("a"), json!({})),
        ];
        let rows = phase_bars(&events, 1);
        let (resource, bars) = &rows[0];
        assert_eq!(resource, "a");
        let spans: Vec<(Phase, DateTime<Utc>, DateTime<Utc>)> =
            bars.iter().map(|b| (b.phase, b.start, b.end)).collect();
        assert_eq!(
            spans,
            vec![
                (Phase::SetUp, at(2) - chrono::Duration::milliseconds(1500), at(2)),
                (Phase::Upload, at(2), at(10)),
                (Phase::StreamCommit, at(10), at(12)),
                (Phase::Plan, at(13), at(14)),
                (Phase::Publication, at(15), at(19)),
            ]
        );
        // `b` has only its stream commit so far.
        assert_eq!(rows[1].1.iter().map(|b| b.phase).collect::<Vec<_>>(), vec![Phase::StreamCommit]);
        assert!(phase_bars(&events, 2).is_empty(), "another delivery's events draw nothing");
    }

    #[test]
    fn the_chart_places_bars_on_one_axis_and_escapes_names() {
        let events = vec![
            event(0, EventKind::SetUpFinished, Some("<b>x</b>"), json!({"duration_ms": 0})),
            event(10, EventKind::CommitStarted, None, json!({})),
        ];
        let chart = phase_chart(&events, 1, None).into_string();
        assert!(chart.contains("data-phase=\"upload\" x=\"160\""), "{chart}");
        assert!(chart.contains("width=\"480\""), "the upload spans the whole axis: {chart}");
        assert!(!chart.contains("<b>x</b>") && chart.contains("&lt;b&gt;x&lt;/b&gt;"), "{chart}");
        assert!(phase_chart(&[], 1, None).into_string().is_empty());
    }
}
