//! The discovery checker judged on request bodies and paths of its own: what it refuses and
//! what it lets through.

use std::sync::OnceLock;

use serde_json::{Value, json};

use super::Discovery;

/// The real document, from `$FILAMENT_BIGQUERY_DISCOVERY`.
fn discovery() -> &'static Discovery {
    static DISCOVERY: OnceLock<Discovery> = OnceLock::new();
    DISCOVERY.get_or_init(Discovery::load)
}

/// What google-cloud-rust adds to the query string of every call.
const ALT: &str = "%24alt=json%3Benum-encoding%3Dint";
const TABLES: &str = "/bigquery/v2/projects/demo/datasets/raw/tables";
const ROUNDING: &str = r#"["ROUNDING_MODE_UNSPECIFIED","ROUND_HALF_AWAY_FROM_ZERO","ROUND_HALF_EVEN"]"#;

/// A tables.insert body as the gateway builds it.
fn table() -> Value {
    let field = |name, kind, mode| json!({"name": name, "type": kind, "mode": mode});
    let mut address = field("address", "RECORD", "NULLABLE");
    address["fields"] = json!([field("city", "STRING", "NULLABLE"), field("lines", "STRING", "REPEATED")]);
    let mut tags = field("tags", "RECORD", "REPEATED");
    tags["fields"] = json!([{"name": "key", "type": "STRING"}]);
    let fields = json!([field("id", "INT64", "REQUIRED"), field("at", "TIMESTAMP", "NULLABLE"), address, tags]);
    json!({
        "tableReference": {"projectId": "demo", "datasetId": "raw", "tableId": "events"},
        "description": "Events of the demo app",
        "labels": {"team": "data"},
        "schema": {"fields": fields},
        "timePartitioning": {"type": "DAY", "field": "at"},
        "clustering": {"fields": ["id", "at"]},
        "requirePartitionFilter": true,
        "expirationTime": "1767225600000",
        "defaultCollation": "",
    })
}

fn job() -> Value {
    json!({
        "jobReference": {"projectId": "demo", "jobId": "filament-1", "location": "US"},
        "configuration": {
            "query": {"query": "SELECT 1", "useLegacySql": false, "maximumBytesBilled": "1000000000"},
            "labels": {"filament-run": "r1"},
        },
    })
}

fn check(method: &str, path: &str, body: Option<&Value>) -> Vec<String> {
    discovery().check_request(method, path, body)
}

#[test]
fn finds_the_method_of_a_path() {
    let method = |http, path| discovery().method_for(http, path);
    assert_eq!(method("POST", TABLES), Some("bigquery.tables.insert"));
    assert_eq!(method("PATCH", "/bigquery/v2/projects/demo/datasets/raw/tables/t"), Some("bigquery.tables.patch"));
    assert_eq!(method("DELETE", "/projects/demo/datasets/raw/tables/t"), Some("bigquery.tables.delete"));
    assert_eq!(method("GET", "/bigquery/v2/projects/demo/datasets/raw"), Some("bigquery.datasets.get"));
    assert_eq!(method("POST", "/bigquery/v2/projects/demo/datasets/raw:undelete"), Some("bigquery.datasets.undelete"));
    assert_eq!(method("GET", "/bigquery/v2/projects/demo/jobs/j1?location=US"), Some("bigquery.jobs.get"));
    assert_eq!(method("GET", "/bigquery/v2/projects/demo/queries/j1"), Some("bigquery.jobs.getQueryResults"));
    assert_eq!(method("PUT", "/bigquery/v2/projects/demo/jobs"), None);
    assert_eq!(method("GET", "/bigquery/v2/projects//datasets"), None);
}

#[test]
fn prefers_the_template_with_more_literal_text_and_wants_required_parameters() {
    let method = |id: &str, flat_path: &str| json!({"id": id, "httpMethod": "POST", "flatPath": flat_path});
    let mut update = method("x.things.update", "projects/{projectsId}/things/{aLongPlaceholderName}");
    update["parameters"] = json!({"mask": {"location": "query", "type": "string", "required": true}});
    let undo = method("x.things.undo", "projects/{projectsId}/things/{thingsId}:undo");
    let methods = json!({"update": update, "undo": undo});
    let discovery =
        Discovery::from_json(json!({"servicePath": "x/v1/", "resources": {"things": {"methods": methods}}}));
    assert_eq!(discovery.method_for("POST", "/x/v1/projects/p/things/a:undo"), Some("x.things.undo"));
    assert_eq!(discovery.method_for("POST", "/x/v1/projects/p/things/a"), Some("x.things.update"));
    assert_eq!(discovery.check_request("POST", "/x/v1/projects/p/things/a?mask=a", None), Vec::<String>::new());
    assert_eq!(
        discovery.check_request("POST", "/x/v1/projects/p/things/a", None),
        ["x.things.update: required query parameter `mask` is missing"]
    );
}

#[test]
fn accepts_the_requests_the_gateway_sends() {
    let mut ranged = table();
    ranged["timePartitioning"] = Value::Null;
    ranged["rangePartitioning"] = json!({"field": "id", "range": {"start": "-10", "end": "1000", "interval": "10"}});
    let reference = json!({"projectId": "demo", "datasetId": "raw"});
    let dataset = json!({"datasetReference": reference, "location": "US", "labels": {"team": "data"}});
    let patch = json!({"schema": {"fields": [{"name": "added", "type": "STRING", "mode": "NULLABLE"}]}});
    let requests = [
        ("POST", format!("{TABLES}?{ALT}"), Some(table())),
        ("POST", format!("{TABLES}?{ALT}"), Some(ranged)),
        ("POST", format!("/bigquery/v2/projects/demo/datasets?accessPolicyVersion=0&{ALT}"), Some(dataset)),
        ("GET", format!("/bigquery/v2/projects/demo/datasets/raw?datasetView=0&accessPolicyVersion=0&{ALT}"), None),
        ("POST", format!("/bigquery/v2/projects/demo/jobs?{ALT}"), Some(job())),
        ("PATCH", format!("{TABLES}/t?autodetectSchema=false&{ALT}"), Some(patch)),
        ("GET", format!("{TABLES}/t?selectedFields=&view=0&{ALT}"), None),
        ("DELETE", format!("{TABLES}/t?{ALT}"), Some(Value::Null)),
        ("GET", "/bigquery/v2/projects/demo/jobs/j1?location=US".to_string(), None),
        ("GET", "/bigquery/v2/projects/demo/jobs?stateFilter=done&stateFilter=running&maxResults=10".to_string(), None),
        ("GET", "/bigquery/v2/projects/demo/queries/j1?location=US&timeoutMs=10000&maxResults=0".to_string(), None),
    ];
    for (method, path, body) in &requests {
        assert_eq!(check(method, path, body.as_ref()), Vec::<String>::new(), "{method} {path}");
    }
}

#[test]
fn rejects_unknown_fields_at_any_depth() {
    let mut table = table();
    table["colour"] = json!("red");
    table["schema"]["fields"][2]["fields"][1]["colour"] = json!("red");
    let problems = discovery().check_body("Table", &table);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].starts_with("Table.colour: unknown field; the fields of Table are biglakeConfiguration, "));
    let nested =
        "Table.schema.fields[2].fields[1].colour: unknown field; the fields of TableFieldSchema are categories";
    assert!(problems[1].starts_with(nested), "{problems:?}");
}

#[test]
fn rejects_int64s_that_are_not_decimal_strings() {
    let mut table = table();
    table["expirationTime"] = json!(1767225600000_i64);
    table["rangePartitioning"] = json!({"field": "id", "range": {"start": "zero"}});
    let number = "expected a string holding a decimal int64 (Google's JSON for int64), got";
    assert_eq!(
        discovery().check_body("Table", &table),
        [
            format!("Table.expirationTime: {number} 1767225600000"),
            "Table.rangePartitioning.range.start: \"zero\" is not a decimal int64".to_string(),
        ]
    );
    let mut job = job();
    job["configuration"]["query"]["maximumBytesBilled"] = json!(1000);
    assert_eq!(
        discovery().check_body("Job", &job),
        [format!("Job.configuration.query.maximumBytesBilled: {number} 1000")]
    );
}

#[test]
fn rejects_values_outside_an_enum() {
    let mut table = table();
    table["schema"]["fields"][0]["roundingMode"] = json!("ROUND_UP");
    table["defaultRoundingMode"] = json!(2);
    assert_eq!(
        discovery().check_body("Table", &table),
        [
            format!("Table.defaultRoundingMode: 2 is not one of {ROUNDING}"),
            format!("Table.schema.fields[0].roundingMode: \"ROUND_UP\" is not one of {ROUNDING}"),
        ]
    );
    // With `enum-encoding=int`, a number is the enum value at that position.
    table["schema"]["fields"][0]["roundingMode"] = json!(3);
    assert_eq!(
        check("POST", &format!("{TABLES}?{ALT}"), Some(&table)),
        [format!("Table.schema.fields[0].roundingMode: 3 is not one of {ROUNDING}")]
    );
}

#[test]
fn rejects_output_only_fields() {
    let mut table = table();
    table["creationTime"] = json!("1767225600000");
    table["etag"] = json!("abc");
    table["replicas"] = json!([]); // marked by `readOnly` alone: "Optional. Output only. ..."
    assert_eq!(
        discovery().check_body("Table", &table),
        [
            "Table.creationTime: output-only field set in a request",
            "Table.etag: output-only field set in a request",
            "Table.replicas: output-only field set in a request",
        ]
    );
    let mut job = job();
    job["status"] = json!({"state": "DONE"});
    job["configuration"]["jobType"] = json!("QUERY");
    assert_eq!(
        discovery().check_body("Job", &job),
        [
            "Job.configuration.jobType: output-only field set in a request",
            "Job.status: output-only field set in a request",
        ]
    );
}

#[test]
fn takes_null_as_unset_except_in_arrays() {
    let mut table = table();
    table["description"] = Value::Null;
    table["labels"]["team"] = Value::Null;
    table["creationTime"] = Value::Null;
    assert_eq!(discovery().check_body("Table", &table), Vec::<String>::new());
    table["clustering"]["fields"][1] = Value::Null;
    assert_eq!(
        discovery().check_body("Table", &table),
        ["Table.clustering.fields[1]: null is not allowed in an array"]
    );
}

#[test]
fn rejects_bad_query_strings_and_bodies() {
    let results = "/bigquery/v2/projects/demo/queries/j1?location=US&timeoutMs=abc&maxResults=-1&colour=red";
    assert_eq!(
        check("GET", results, None),
        [
            "bigquery.jobs.getQueryResults: query parameter `timeoutMs`: \"abc\" is not a decimal uint32",
            "bigquery.jobs.getQueryResults: query parameter `maxResults`: \"-1\" is not a decimal uint32",
            "bigquery.jobs.getQueryResults: unknown query parameter `colour`",
        ]
    );
    assert_eq!(
        check("GET", "/bigquery/v2/projects/demo/jobs/j1?location=US&location=EU&prettyPrint=yes", None),
        [
            "bigquery.jobs.get: query parameter `location` is given more than once but is not repeated",
            "bigquery.jobs.get: query parameter `prettyPrint`: \"yes\" is not true or false",
        ]
    );
    let alt = "/bigquery/v2/projects/demo/jobs/j1?%24alt=json%3Benum-encoding%3Dstring";
    let formats = r#"["json","media","proto"]"#;
    assert_eq!(
        check("GET", alt, None),
        [format!("bigquery.jobs.get: query parameter `$alt`: \"json;enum-encoding=string\" is not one of {formats}")]
    );
    assert_eq!(
        check("POST", "/bigquery/v2/projects/demo/jobs", None),
        ["bigquery.jobs.insert: takes a Job body, none was sent"]
    );
    assert_eq!(
        check("DELETE", &format!("{TABLES}/t"), Some(&json!({}))),
        ["bigquery.tables.delete: takes no body, one was sent"]
    );
    assert_eq!(
        check("GET", "/bigquery/v2/projects/demo/tables", None),
        ["GET /bigquery/v2/projects/demo/tables: no method of the discovery document has this method and path"]
    );
}
