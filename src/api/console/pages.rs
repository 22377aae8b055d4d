//! The console's HTML, rendered by maud templates: every value inserted is HTML-escaped by
//! the template (a run id, a resource name or an error message holding `<script>` shows as
//! text). Pages link one stylesheet and run no script; an execution that has not ended
//! refreshes itself with `<meta http-equiv="refresh">`. The views come from the API's own
//! (`api::views`, `api::run_list`, `store::events`), so the console shows what the API answers.

use maud::{DOCTYPE, Markup, html};

use super::RunsFilter;
use crate::api::run_list::{RunList, RunListItem};
use crate::api::views::{ExecutionResourceView, ExecutionView, PlanView, PublicationView, RunView};
use crate::error::Problem;
use crate::model::ExecutionState;
use crate::store::EventRecord;

/// Seconds between the refreshes of an execution that has not ended.
pub(crate) const REFRESH_SECS: u32 = 3;

/// The states the runs list filters by, in lifecycle order.
const STATES: [ExecutionState; 7] = [
    ExecutionState::Extracting,
    ExecutionState::Paused,
    ExecutionState::Committing,
    ExecutionState::Staged,
    ExecutionState::Committed,
    ExecutionState::Failed,
    ExecutionState::Aborted,
];

/// Everything around a page's content: the header with the principal signed in and sign-out.
pub(super) fn layout(title: &str, principal: Option<&str>, refresh_secs: Option<u32>, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(secs) = refresh_secs { meta http-equiv="refresh" content=(secs); }
                title { (title) " · filament-bigquery" }
                link rel="stylesheet" href="/ui/console.css";
            }
            body {
                header {
                    a.brand href="/ui/" { "filament-bigquery" }
                    @if let Some(principal) = principal {
                        span.who { "signed in as " strong #principal { (principal) } }
                        form.sign-out method="post" action="/ui/sign-out" {
                            button #sign-out type="submit" { "Sign out" }
                        }
                    }
                }
                main { (content) }
            }
        }
    }
}

/// The sign-in form; `refusal` says why the last attempt or the request was refused.
pub(super) fn sign_in(next: &str, refusal: Option<&str>) -> Markup {
    let content = html! {
        h1 { "Sign in" }
        @if let Some(refusal) = refusal { p.error #refusal { (refusal) } }
        form.sign-in method="post" action="/ui/sign-in" {
            label for="token" { "Token or Google ID token" }
            input #token type="password" name="token" autocomplete="off" required;
            input type="hidden" name="next" value=(next);
            button #sign-in type="submit" { "Sign in" }
        }
        p.note { "The gateway keeps a signed session cookie naming your principal; the token is not stored." }
    };
    layout("Sign in", None, None, content)
}

/// A request the console refused or could not answer, with the API's code and hint.
pub(super) fn problem(principal: Option<&str>, problem: &Problem) -> Markup {
    let content = html! {
        h1 { (problem.code.title()) }
        (error_box(problem.code.as_str(), &problem.detail, problem.hint.as_deref()))
        p { a href="/ui/" { "Back to the runs" } }
    };
    layout(problem.code.title(), principal, None, content)
}

fn error_box(code: &str, detail: &str, hint: Option<&str>) -> Markup {
    html! {
        div.error-box role="alert" {
            p { "Error " code.error-code { (code) } }
            p.detail { (detail) }
            @if let Some(hint) = hint { p.hint { "Hint: " (hint) } }
        }
    }
}

fn state_badge(state: ExecutionState) -> Markup {
    html! { span class={ "state state-" (state.as_str()) } { (state.as_str()) } }
}

/// The runs list with its filters and the link to the next page.
pub(super) fn runs(principal: &str, filter: &RunsFilter, list: &RunList) -> Markup {
    let content = html! {
        h1 { "Runs" }
        (runs_filter_form(filter))
        @if list.runs.is_empty() { p #no-runs { "No runs match." } } @else {
            table #runs {
                thead { tr { th { "Run" } th { "Destination" } th { "Principal" } th { "Created" } th { "Updated" }
                    th { "Latest execution" } th { "State" } th.num { "Rows received" } th.num { "Rows acknowledged" }
                    th.num { "Bytes" } th { "Error" } } }
                tbody { @for run in &list.runs { (run_row(run)) } }
            }
        }
        @if let Some(token) = &list.next_page_token {
            p { a #next-page href={ "/ui/?" (filter.query_with_page_token(token)) } { "Older runs" } }
        }
    };
    layout("Runs", Some(principal), None, content)
}

fn runs_filter_form(filter: &RunsFilter) -> Markup {
    let text = |name: &'static str, label: &'static str, value: &Option<String>, placeholder: &'static str| {
        html! { label { (label) " " input type="text" name=(name) value=[value] placeholder=(placeholder); } }
    };
    html! {
        form.filters method="get" action="/ui/" {
            label { "State " select name="state" {
                option value="" { "any" }
                @for state in STATES {
                    option value=(state.as_str()) selected[filter.state.as_deref() == Some(state.as_str())] { (state.as_str()) }
                }
            } }
            (text("dataset", "Dataset", &filter.dataset, ""))
            (text("principal", "Principal", &filter.principal, ""))
            (text("created_after", "Created after", &filter.created_after, "2026-12-01T00:00:00Z"))
            (text("created_before", "Created before", &filter.created_before, "RFC 3339"))
            button type="submit" { "Filter" }
        }
    }
}

fn run_row(run: &RunListItem) -> Markup {
    let run_href = format!("/ui/runs/{}", run.run_id);
    html! {
        tr data-run=(run.run_id) {
            td { a href=(run_href) { (run.run_id) } }
            td { (run.destination.project) "." (run.destination.dataset) }
            td { (run.principal) }
            td { (run.created_at.format("%Y-%m-%d %H:%M:%S")) }
            td { (run.updated_at.format("%Y-%m-%d %H:%M:%S")) }
            @match &run.latest_execution {
                None => { td { "none yet" } td {} td {} td {} td {} td {} }
                Some(execution) => {
                    td { a href={ (run_href) "/executions/" (execution.execution_id) } { (execution.execution_id) } }
                    td { (state_badge(execution.state)) }
                    td.num { (execution.rows_received) }
                    td.num { (execution.rows_acknowledged) }
                    td.num { (execution.bytes_received) }
                    td { @if let Some(error) = &execution.error {
                        code.error-code { (error.code) }
                        @if let Some(hint) = &error.hint { " " span.hint { (hint) } }
                    } }
                }
            }
        }
    }
}

/// A run: where it loads, its resources with their declared layout, its executions.
pub(super) fn run(principal: &str, run: &RunView) -> Markup {
    let destination = &run.destination;
    let content = html! {
        h1 { "Run " span #run-id { (run.run_id) } }
        dl {
            dt { "Destination" } dd { (destination.project) "." (destination.dataset)
                @if let Some(location) = &destination.location { " (" (location) ")" } }
            dt { "Principal" } dd { (run.principal) }
            dt { "Created" } dd { (run.created_at.to_rfc3339()) }
            @if let Some(project) = &run.job_project { dt { "Job project" } dd { (project) } }
            @if let Some(bytes) = run.maximum_bytes_billed { dt { "Maximum bytes billed" } dd { (bytes) } }
            @if let Some(bytes) = run.maximum_bytes_billed_per_execution {
                dt { "Maximum bytes billed per execution" } dd { (bytes) }
            }
        }
        h2 { "Resources" }
        table #resources {
            thead { tr { th { "Resource" } th { "Table" } th { "Write mode" } th { "Primary key" } th { "Declared layout" } } }
            tbody { @for resource in &run.resources { tr {
                td { (resource.resource) } td { (resource.table) } td { (resource.write_mode.to_string()) }
                td { (resource.primary_key.join(", ")) }
                td { @if let Some(options) = &resource.table_options {
                    pre { (serde_json::to_string_pretty(options).unwrap_or_default()) } } @else { "none" }
                    @if let Some(mismatch) = &resource.layout_mismatch {
                        p.error { "The existing table differs: " (serde_json::to_string(mismatch).unwrap_or_default()) } }
                }
            } } }
        }
        h2 { "Executions" }
        @if run.executions.is_empty() { p { "None yet." } } @else {
            table #executions { thead { tr { th { "Execution" } th { "State" } } } tbody {
                @for execution in &run.executions { tr {
                    td { a href={ "/ui/runs/" (run.run_id) "/executions/" (execution.execution_id) } { (execution.execution_id) } }
                    td { (state_badge(execution.state)) }
                } }
            } }
        }
    };
    layout(&format!("Run {}", run.run_id), Some(principal), None, content)
}

/// Where the publication jobs of `run` run and are listed in the BigQuery console.
pub(super) struct JobConsole<'a> {
    pub(super) project: &'a str,
    /// The dataset's location, `US` when the run left it to BigQuery (its default).
    pub(super) location: &'a str,
}

impl JobConsole<'_> {
    fn job_href(&self, job_id: &str) -> String {
        let query = serde_urlencoded::to_string([
            ("project", self.project),
            ("j", &format!("bq:{}:{job_id}", self.location)),
            ("page", "queryresults"),
        ])
        .unwrap_or_default();
        format!("https://console.cloud.google.com/bigquery?{query}")
    }
}

/// An execution: its state and error, each resource's progress and publication, its timeline.
pub(super) fn execution(principal: &str, view: &ExecutionView, events: &[EventRecord], jobs: &JobConsole) -> Markup {
    // A staged execution waits for a person's commit or abort: nothing to follow.
    let refresh = (!view.state.is_resting()).then_some(REFRESH_SECS);
    let content = html! {
        p.crumbs { a href={ "/ui/runs/" (view.run_id) } { "Run " (view.run_id) } }
        h1 { "Execution " span #execution-id { (view.execution_id) } " " (state_badge(view.state)) }
        @if let Some(error) = &view.error { (error_box(error.code.as_str(), &error.detail, error.hint.as_deref())) }
        p { "Delivery " (view.delivery) " · opened " (view.created_at.to_rfc3339()) " · updated " (view.updated_at.to_rfc3339())
            @if refresh.is_some() { " · refreshes every " (REFRESH_SECS) " s" } }
        h2 { "Resources" }
        table #progress {
            thead { tr { th { "Resource" } th { "Table" } th { "Write mode" } th { "Acknowledged" } th.num { "Rows received" }
                th.num { "Rows acknowledged" } th.num { "Bytes" } th.num { "Batches" } th { "Publication" } } }
            tbody { @for resource in &view.resources { (resource_row(resource, events, jobs)) } }
        }
        @if let Some(plan) = &view.plan { (plan_section(plan)) }
        (super::phases::phase_chart(events, view.delivery, view.plan.as_ref()))
        h2 { "Timeline" }
        (timeline(events))
    };
    layout(&format!("Execution {}", view.execution_id), Some(principal), refresh, content)
}

fn resource_row(resource: &ExecutionResourceView, events: &[EventRecord], jobs: &JobConsole) -> Markup {
    html! {
        tr data-resource=(resource.resource) {
            td { (resource.resource) } td { (resource.table) } td { (resource.write_mode.to_string()) }
            td { progress value=(resource.rows_acknowledged) max=(resource.rows_received.max(1)) {} }
            td.num.rows-received { (resource.rows_received) }
            td.num.rows-acknowledged { (resource.rows_acknowledged) }
            td.num { (resource.bytes_received) }
            td.num { (resource.batches) }
            td { @match &resource.publication { None => "not yet", Some(publication) => (publication_cell(publication, events, jobs)) } }
        }
    }
}

fn publication_cell(publication: &PublicationView, events: &[EventRecord], jobs: &JobConsole) -> Markup {
    let duration_ms = events
        .iter()
        .rev()
        .find(|event| event.detail["job_id"].as_str() == Some(publication.job_id.as_str()))
        .and_then(|event| event.detail["duration_ms"].as_u64());
    let state = serde_json::to_value(publication.state).ok().and_then(|v| v.as_str().map(str::to_string));
    html! {
        div.publication {
            a.job href=(jobs.job_href(&publication.job_id)) rel="noreferrer" { (publication.job_id) }
            " " span.state { (state.unwrap_or_default()) }
            @if let Some(ms) = duration_ms { " · " (ms) " ms" }
            @if let Some(rows) = publication.rows_affected { " · " (rows) " rows affected" }
            @if let Some(bytes) = publication.cost.bytes_billed { " · " (bytes) " bytes billed" }
            @if let Some(error) = &publication.error { (error_box(error.code.as_str(), &error.detail, error.hint.as_deref())) }
        }
    }
}

/// Width of the plan's byte bars, in SVG user units.
const PLAN_BAR_WIDTH: i64 = 160;

/// The priced plan of the commit: each publication's statement, its dry-run bytes (a bar scaled
/// to the largest) and estimated cost, then the totals.
fn plan_section(plan: &PlanView) -> Markup {
    let largest = plan.publications.iter().filter_map(|p| p.priced.bytes_processed).max().unwrap_or(0).max(1);
    html! {
        h2 { "Plan" }
        p { "Delivery " (plan.delivery) " · planned " (plan.planned_at.to_rfc3339()) " at $" (plan.price_per_tib_usd)
            " per TiB · " span #plan-total { (plan.bytes_processed) " bytes, $" (format!("{:.6}", plan.estimated_cost_usd)) }
            " · " (plan.query_jobs) " query jobs" @if plan.unpriced > 0 { " · " (plan.unpriced) " unpriced" } }
        table #plan {
            thead { tr { th { "Resource" } th { "Table" } th { "Path" } th { "Statement" } th.num { "Bytes" } th { "" }
                th.num { "Estimated cost" } th.num { "Query jobs" } } }
            tbody { @for planned in &plan.publications {
                @let priced = &planned.priced;
                tr data-resource=(priced.resource) {
                    td { (priced.resource) } td { (priced.table) } td { (priced.path.as_str()) }
                    td.statement { (priced.statement.as_str()) }
                    td.num.bytes { @match priced.bytes_processed { Some(bytes) => (bytes), None => "unpriced" } }
                    td { (byte_bar(priced.bytes_processed.unwrap_or(0), largest)) }
                    td.num { @if let Some(cost) = planned.estimated_cost_usd { "$" (format!("{cost:.6}")) } }
                    td.num { (priced.query_jobs) }
                }
                @if let Some(why) = &priced.unpriced { tr.unpriced { td colspan="8" { (why) } } }
            } }
        }
    }
}

/// A publication's bytes as a bar, scaled so that the largest of the plan fills the width.
fn byte_bar(bytes: i64, largest: i64) -> Markup {
    let width = (i128::from(bytes.max(0)) * i128::from(PLAN_BAR_WIDTH) / i128::from(largest)) as i64;
    html! {
        svg.bytes-bar width=(PLAN_BAR_WIDTH) height="10" viewBox={ "0 0 " (PLAN_BAR_WIDTH) " 10" } role="img"
            aria-label={ (bytes) " bytes" } {
            rect width=(PLAN_BAR_WIDTH) height="10" fill="#eee" {}
            rect width=(width) height="10" fill="#4a7bd0" {}
        }
    }
}

fn timeline(events: &[EventRecord]) -> Markup {
    html! {
        @if events.is_empty() { p { "No events yet." } } @else {
            table #timeline {
                thead { tr { th { "At" } th.num { "Delivery" } th { "Event" } th { "Resource" } th.num { "Count" } th { "Detail" } } }
                tbody { @for event in events { tr data-kind=(event.kind.as_str()) {
                    td { (event.at.format("%H:%M:%S%.3f")) }
                    td.num { (event.delivery) }
                    td { (event.kind.as_str()) }
                    td { (event.resource.as_deref().unwrap_or("")) }
                    td.num { (event.count) }
                    td { code { (event.detail.to_string()) } }
                } } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn every_value_is_escaped() {
        let hostile = Problem::new(ErrorCode::InvalidIdentifier, "no run <script>alert(1)</script>")
            .with_hint("a \"quoted\" & <b>bold</b> hint");
        let page = problem(Some("<img src=x>"), &hostile).into_string();
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(!page.contains("<img src=x>"), "{page}");
        assert!(!page.contains("<b>bold"), "{page}");
        assert!(page.contains("no run &lt;script&gt;alert(1)&lt;/script&gt;"), "{page}");
        let form = sign_in("/ui/\"><script>", Some("<i>refused</i>")).into_string();
        assert!(!form.contains("\"><script>") && !form.contains("<i>refused"), "{form}");
    }

    #[test]
    fn a_job_links_to_the_bigquery_console_of_its_project_and_location() {
        let jobs = JobConsole { project: "acme-prod", location: "EU" };
        assert_eq!(
            jobs.job_href("filament_pub_1"),
            "https://console.cloud.google.com/bigquery?project=acme-prod&j=bq%3AEU%3Afilament_pub_1&page=queryresults"
        );
    }
}
