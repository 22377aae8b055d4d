//! The Arrow project's own IPC test files against the real gateway: apache/arrow-testing's
//! integration streams (written by Arrow C++ and the other implementations: 1.0.0 little- and
//! big-endian, 2.0.0 buffer compression, 4.0.0 shared dictionaries, C++ 21) and its stream
//! fuzzers' regression files, copied to `tests/data/arrow-testing` (README: the commit).
//!
//! Each file is its own case, judged by pyarrow ([`judge`]): a file the rules of
//! `docs/type-mapping.md` load is accepted with pyarrow's row count and its values read back
//! from BigQuery (the emulator) as pyarrow reads them; where the emulator cannot store a type
//! BigQuery has (STRUCT and maps on its write path, BIGNUMERIC, and INTERVAL, which it reads
//! back as a `relativedelta`), the rows the gateway appended are judged instead, from the
//! Storage Write fake. A file the rules refuse is refused with the code and column (and row,
//! for a value) the judge finds, at the schema message when its schema decides (the schema
//! message followed by garbage gets the same answer), changing nothing; its values that BigQuery
//! holds load. Fuzz files get a 4xx. Every answer leaves the gateway healthy and within its
//! memory bound. The files of one directory share two gateways and one run, one resource each,
//! and every failure is reported, file by file, at the end.

mod forged;
mod judge;

use std::path::{Path, PathBuf};

use reqwest::StatusCode;
use serde_json::Value;

use self::judge::{Expect, Plan};
use super::hostile::{assert_within_memory_bound, healthy};
use crate::support::fake_write::FakeWrite;
use crate::support::rest_proxy::RestProxy;
use crate::support::{Gateway, GatewayOptions, TestRun, required_env};

const RUN: &str = "arrow";
const EXECUTION: &str = "e";

/// The files under `directory` of the data, in name order.
fn files_under(directory: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(Path::new(judge::DATA).join(directory))
        .unwrap_or_else(|e| panic!("{directory}: {e}"))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

/// A file's resource: its name without extension (the clean variant prefixed `clean_`).
fn resource_name(plan: &Plan, clean: bool) -> String {
    let stem =
        Path::new(&plan.file).file_stem().unwrap().to_string_lossy().replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    if clean { format!("clean_{stem}") } else { stem }
}

/// A gateway appending to the emulator, and one appending to the Storage Write fake (which
/// keeps the staged batches) for the files judged as staged; its REST proxy creates BIGNUMERIC
/// columns as NUMERIC, which the emulator can create (the staging tables hold strings).
struct Gateways {
    emulated: Gateway,
    staged: Gateway,
    fake: FakeWrite,
    _proxy: RestProxy,
}

impl Gateways {
    async fn start(cases: &[(String, Plan)]) -> Self {
        let fake = FakeWrite::start().await;
        fake.with(|state| state.keep_batches = true);
        let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
        proxy.state.lock().unwrap().bignumeric_as_numeric = true;
        let emulated = GatewayOptions::new().spawn().await;
        let staged = GatewayOptions::new().fake_write(&fake).rest_proxy(&proxy).spawn().await;
        let gateways = Self { emulated, staged, fake, _proxy: proxy };
        for staged in [false, true] {
            let resources: Vec<&str> =
                cases.iter().filter(|(_, plan)| plan.judged_staged() == staged).map(|(r, _)| r.as_str()).collect();
            TestRun::new(RUN, EXECUTION).full_append(&resources).open(gateways.of_staged(staged)).await;
        }
        gateways
    }

    fn of_staged(&self, staged: bool) -> &Gateway {
        if staged { &self.staged } else { &self.emulated }
    }

    fn of(&self, plan: &Plan) -> &Gateway {
        self.of_staged(plan.judged_staged())
    }
}

/// Judges every integration file of `directories` (see the module documentation).
async fn judge_integration_files(directories: &[&str]) {
    let files: Vec<PathBuf> = directories.iter().flat_map(|d| files_under(&format!("integration/{d}"))).collect();
    let clean_files = tempfile::tempdir().unwrap();
    let plans = judge::plan(&files, clean_files.path()).await;
    assert_eq!(plans.len(), files.len());
    let mut cases: Vec<(String, Plan)> = Vec::new();
    for plan in plans {
        cases.push((resource_name(&plan, false), plan.clone()));
        if let Some(clean) = plan.clean {
            cases.push((resource_name(&clean, true), *clean));
        }
    }
    let gateways = Gateways::start(&cases).await;
    let mut failures = Vec::new();
    for (resource, plan) in &cases {
        if let Err(failure) = post_and_judge(gateways.of(plan), resource, plan).await {
            failures.push(format!("{}: {failure}", plan.name));
        }
    }
    for staged in [false, true] {
        let gw = gateways.of_staged(staged);
        let ended = gw.commit_until_ended(RUN, EXECUTION).await;
        // The emulator holds what it was sent; the fake's publication reads empty staging tables.
        if !staged {
            assert_eq!(ended["state"], "committed", "{ended}");
        }
        healthy(gw).await;
        assert_within_memory_bound(gw);
    }
    for (resource, plan) in cases.iter().filter(|(_, plan)| matches!(plan.expect, Expect::Load { .. }) && plan.rows > 0)
    {
        if let Err(failure) = judge_values(&gateways, resource, plan).await {
            failures.push(format!("{} (values): {failure}", plan.name));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// Posts the file and judges the answer; a refusal must change nothing, and a refusal at the
/// schema must be the answer to the schema message alone, followed by garbage.
async fn post_and_judge(gw: &Gateway, resource: &str, plan: &Plan) -> Result<(), String> {
    let bytes = std::fs::read(&plan.file).unwrap();
    let before = gw.db_snapshot().await;
    let (status, body) = gw.post_batch(RUN, EXECUTION, resource, None, bytes.clone()).await;
    healthy(gw).await;
    assert_within_memory_bound(gw);
    match &plan.expect {
        Expect::Load { .. } if status == StatusCode::ACCEPTED && body["rows"] == plan.rows => Ok(()),
        Expect::Load { .. } => Err(format!("expected {} rows loaded, got {status} {body}", plan.rows)),
        Expect::Refused { refused_at, answers } => {
            expected_refusal(status, &body, refused_at, answers)?;
            if gw.db_snapshot().await != before {
                return Err(format!("refused ({body}) but the state changed"));
            }
            if refused_at == "schema" {
                let (status, again) = gw.post_batch(RUN, EXECUTION, resource, None, schema_then_garbage(&bytes)).await;
                if again["code"] != body["code"] {
                    return Err(format!("its schema message alone is answered {status} {again}, the file {body}"));
                }
            }
            Ok(())
        }
    }
}

/// The answer is a 422 the judge lists: `[code, column]` at the schema (the column named in
/// the detail, when it names one: its top-level part), `[code, column, row]` at a batch.
fn expected_refusal(status: StatusCode, body: &Value, refused_at: &str, answers: &[Vec<Value>]) -> Result<(), String> {
    let refused = || format!("expected a refusal among {answers:?}, got {status} {body}");
    if status != StatusCode::UNPROCESSABLE_ENTITY {
        return Err(refused());
    }
    let detail = body["detail"].as_str().unwrap_or_default();
    let column = detail.split_once("column \"").and_then(|(_, rest)| rest.split_once('"')).map(|(name, _)| name);
    let row = detail.split_once("\" row ").and_then(|(_, rest)| rest.split(':').next()?.parse::<u64>().ok());
    let matches = |answer: &Vec<Value>| {
        answer[0] == body["code"]
            && match (refused_at, &answer[1], column) {
                ("schema", Value::Null, _) => true,
                ("schema", Value::String(expected), Some(named)) => named.split('.').next() == Some(expected.as_str()),
                ("schema", Value::String(_), None) => body["code"] != "unsupported_type",
                (_, Value::String(expected), Some(named)) => named == expected && answer[2].as_u64() == row,
                _ => false,
            }
    };
    if answers.iter().any(matches) { Ok(()) } else { Err(refused()) }
}

/// The stream's first message (its schema) followed by a message that is not a flatbuffer.
fn schema_then_garbage(stream: &[u8]) -> Vec<u8> {
    let at = if stream[..4] == [0xFF; 4] { 4 } else { 0 };
    let length = u32::from_le_bytes(stream[at..at + 4].try_into().unwrap()) as usize;
    let metadata = &stream[at + 4..at + 4 + length];
    let body = arrow_ipc::root_as_message(metadata).map_or(0, |m| m.bodyLength() as usize);
    let mut out = stream[..at + 4 + length + body].to_vec();
    out.extend_from_slice(&[0xFF; 4]);
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(b"not a flatbuffer");
    out
}

/// The loaded rows, as BigQuery returns them or as the gateway staged them, are the file's.
async fn judge_values(gateways: &Gateways, resource: &str, plan: &Plan) -> Result<(), String> {
    let differences = if plan.judged_staged() {
        let staged = tempfile::NamedTempFile::new().unwrap();
        write_stream(&staged_batches(&gateways.fake, resource), staged.path());
        judge::check_staged(plan, staged.path()).await
    } else {
        let gw = &gateways.emulated;
        let select = plan.select.as_deref().expect("the judge's select");
        let rows = gw.query(&format!("SELECT {select} FROM `{}`.`{resource}`", gw.dataset)).await;
        judge::check_query(plan, &rows).await
    };
    if differences.is_null() { Ok(()) } else { Err(differences.to_string()) }
}

/// The batches appended to the committed stream of `resource`'s staging table
/// (`_filament_stg_<table>_<32 hex digits>`: a 128-bit hash, `model::staging`).
fn staged_batches(fake: &FakeWrite, resource: &str) -> Vec<arrow_array::RecordBatch> {
    let prefix = format!("/tables/_filament_stg_{resource}_");
    let of_resource = |table: &str| {
        table
            .split_once(&prefix)
            .is_some_and(|(_, hash)| hash.len() == 32 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    fake.with(|state| {
        let mut streams = state.streams.values().filter(|stream| of_resource(&stream.table) && stream.committed);
        let stream = streams.next().unwrap_or_else(|| panic!("no committed stream of {resource}"));
        assert!(streams.next().is_none(), "one committed stream of {resource}");
        stream.batches.clone()
    })
}

fn write_stream(batches: &[arrow_array::RecordBatch], path: &Path) {
    let file = std::fs::File::create(path).unwrap();
    let schema = batches.first().expect("staged batches").schema();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(file, &schema).unwrap();
    for batch in batches {
        writer.write(batch).unwrap();
    }
    writer.finish().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_arrow_projects_little_endian_1_0_0_files_load_exactly_or_are_refused_by_name() {
    judge_integration_files(&["1.0.0-littleendian"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_arrow_projects_big_endian_1_0_0_files_are_refused_at_the_schema_by_byte_order() {
    judge_integration_files(&["1.0.0-bigendian"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_arrow_projects_arrow_cpp_21_files_load_exactly_or_are_refused_by_name() {
    judge_integration_files(&["cpp-21.0.0"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_arrow_projects_compressed_and_shared_dictionary_files_load_exactly() {
    judge_integration_files(&["2.0.0-compression", "4.0.0-shareddict"]).await;
}

/// The stream fuzzers' regression files (crashes and misbehaviour of Arrow C++'s reader):
/// each gets a 4xx and changes nothing, the gateway stays healthy and within its memory bound.
#[tokio::test(flavor = "multi_thread")]
async fn the_arrow_projects_stream_fuzz_files_get_a_4xx_and_leave_the_gateway_healthy() {
    let gw = GatewayOptions::new().spawn().await;
    TestRun::new(RUN, EXECUTION).full_append(&["t"]).open(&gw).await;
    let before = gw.db_snapshot().await;
    let mut failures = Vec::new();
    let files = files_under("fuzz");
    for file in &files {
        let (status, body) = gw.post_batch(RUN, EXECUTION, "t", None, std::fs::read(file).unwrap()).await;
        if !status.is_client_error() || body["code"].as_str().is_none() {
            failures.push(format!("{}: {status} {body}", file.display()));
        }
        healthy(&gw).await;
        assert_within_memory_bound(&gw);
    }
    assert_eq!(gw.db_snapshot().await, before, "a refused body changed the state");
    assert!(failures.is_empty(), "{} of {} fuzz files:\n{}", failures.len(), files.len(), failures.join("\n"));
}
