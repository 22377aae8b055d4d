use super::*;

#[test]
fn staging_tables_compare_strings_by_code_point_whatever_the_dataset_default() {
    let reference = table_reference("p", "d", "_filament_stg_t");
    let body = staging_table_body(reference, &[Column::new("code", BigQueryType::String)], Some(86_400_000));
    let wire = serde_json::to_value(&body).unwrap();
    assert_eq!(wire["defaultCollation"], "", "sent, not left out: {wire}");
    assert_eq!(wire["schema"]["fields"][0]["name"], "code");
    assert_eq!(wire["expirationTime"], "86400000");
}

fn existing(name: &str, type_name: &str, mode: &str) -> TableFieldSchema {
    TableFieldSchema::new().set_name(name).set_type(type_name).set_mode(mode)
}

#[test]
fn compares_existing_columns_with_legacy_type_names_and_shapes() {
    let address = Column::new(
        "address",
        BigQueryType::Struct(vec![Column::new("city", BigQueryType::String), Column::new("zip", BigQueryType::Int64)]),
    );
    let table = vec![
        existing("id", "INTEGER", "NULLABLE"),
        existing("Name", "STRING", ""),
        existing("score", "STRING", "NULLABLE"),
        existing("tags", "STRING", "NULLABLE"),
        existing("amount", "NUMERIC", "NULLABLE"),
        field_schema(&address),
        existing("other", "RECORD", "NULLABLE").set_fields([existing("city", "STRING", "NULLABLE")]),
    ];
    let wanted = vec![
        Column::new("id", BigQueryType::Int64),
        Column::new("name", BigQueryType::String),
        Column::new("score", BigQueryType::Float64),
        Column::repeated("tags", BigQueryType::String),
        Column::new("amount", BigQueryType::Numeric),
        address.clone(),
        Column { name: "other".into(), ..address.clone() },
        Column::new("extra", BigQueryType::Bool),
    ];
    let conflicts = type_conflicts(&table, &wanted);
    assert_eq!(
        conflicts,
        vec![
            ("score".into(), "STRING".into(), "FLOAT64".into()),
            ("tags".into(), "STRING".into(), "ARRAY<STRING>".into()),
            ("other".into(), "RECORD<city STRING>".into(), "STRUCT<city STRING, zip INT64>".into()),
        ]
    );
    assert_eq!(missing_columns(&table, &wanted).iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["extra"]);
}

fn layout(options: serde_json::Value, columns: &[Column]) -> TableLayout {
    let declared = serde_json::from_value(options).unwrap();
    let options = TableOptions::parse(&declared, crate::model::WriteMode::FullAppend, &[]).unwrap();
    TableLayout::resolve(Some(&options), crate::model::WriteMode::FullAppend, &[], columns, &Default::default())
        .unwrap()
}

#[test]
fn a_destination_table_is_created_with_its_declared_layout() {
    let columns = [Column::new("id", BigQueryType::Int64), Column::new("region", BigQueryType::String)];
    let ranged = layout(
        serde_json::json!({
            "partitioning": {"field": "ID", "range": {"start": 0, "end": 1000000, "interval": 1000}},
            "clustering": ["region", "id"],
            "require_partition_filter": true,
            "expiration_days": 2,
            "description": "Users",
            "labels": {"team": "data"},
        }),
        &columns,
    );
    let body = destination_table_body(table_reference("p", "d", "t"), &columns, &ranged, 1_000);
    let json = serde_json::to_value(&body).unwrap();
    assert_eq!(
        json["rangePartitioning"],
        serde_json::json!({"field": "id", "range": {"start": "0", "end": "1000000", "interval": "1000"}})
    );
    assert!(json.get("timePartitioning").is_none(), "{json}");
    assert_eq!(json["clustering"], serde_json::json!({"fields": ["region", "id"]}));
    assert_eq!(json["requirePartitionFilter"], true);
    assert_eq!(json["expirationTime"], serde_json::json!((1_000 + 2 * MILLIS_PER_DAY).to_string()));
    assert_eq!((json["description"].as_str(), &json["labels"]), (Some("Users"), &serde_json::json!({"team": "data"})));

    let ingestion = layout(serde_json::json!({"partitioning": {"granularity": "DAY"}}), &columns);
    let json =
        serde_json::to_value(destination_table_body(table_reference("p", "d", "t"), &columns, &ingestion, 0)).unwrap();
    assert_eq!(json["timePartitioning"], serde_json::json!({"type": "DAY"}));
    for absent in ["rangePartitioning", "clustering", "requirePartitionFilter", "expirationTime", "description"] {
        assert!(json.get(absent).is_none(), "{absent} in {json}");
    }
}

#[test]
fn an_existing_layout_is_compared_with_what_was_declared_only() {
    let declared: TableOptions = serde_json::from_value(serde_json::json!({
        "partitioning": {"field": "created_at", "granularity": "DAY"},
        "clustering": ["id"],
    }))
    .unwrap();
    let same = Table::new()
        .set_time_partitioning(TimePartitioning::new().set_type("DAY").set_field("CREATED_AT"))
        .set_clustering(Clustering::new().set_fields(["id"]))
        .set_require_partition_filter(true);
    assert_eq!(layout_differences(&same, &declared), [], "require_partition_filter was not declared");
    let differences = layout_differences(&Table::new(), &declared);
    let shown: Vec<_> =
        differences.iter().map(|d| (d.option.as_str(), d.table.as_str(), d.declared.as_str())).collect();
    assert_eq!(shown, [("partitioning", "none", "DAY on created_at"), ("clustering", "none", "id")]);
    let monthly = Table::new().set_time_partitioning(TimePartitioning::new().set_type("MONTH"));
    let none_declared: TableOptions = serde_json::from_value(serde_json::json!({"clustering": []})).unwrap();
    assert_eq!(layout_differences(&monthly, &none_declared), []);
    assert_eq!(layout_differences(&monthly, &declared)[0].table, "MONTH by ingestion time");
}

#[test]
fn nested_columns_become_record_fields() {
    let column = Column::repeated(
        "items",
        BigQueryType::Struct(vec![Column::new("sku", BigQueryType::String), Column::new("at", BigQueryType::Time)]),
    );
    let field = field_schema(&column);
    assert_eq!((field.r#type.as_str(), field.mode.as_str()), ("RECORD", "REPEATED"));
    assert_eq!(field.fields.iter().map(|f| f.r#type.as_str()).collect::<Vec<_>>(), ["STRING", "TIME"]);
    assert_eq!(describe_field(&field), "REPEATED RECORD<sku STRING, at TIME>");
}
