//! Pure GoogleSQL generation for publication, snapshot-tested. Every identifier is validated
//! upstream (`model`, `ingest::schema`) and quoted here with backticks; a backtick or backslash
//! that slipped through is escaped rather than trusted.

use crate::ingest::schema::Column;

/// A fully qualified table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRef<'a> {
    pub project: &'a str,
    pub dataset: &'a str,
    pub table: &'a str,
}

/// Quotes one identifier part.
pub fn quote_identifier(part: &str) -> String {
    let mut quoted = String::with_capacity(part.len() + 2);
    quoted.push('`');
    for c in part.chars() {
        if c == '`' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('`');
    quoted
}

impl TableRef<'_> {
    pub fn quoted(&self) -> String {
        format!(
            "{}.{}.{}",
            quote_identifier(self.project),
            quote_identifier(self.dataset),
            quote_identifier(self.table)
        )
    }
}

fn column_list(columns: &[Column]) -> String {
    columns.iter().map(|c| quote_identifier(&c.name)).collect::<Vec<_>>().join(", ")
}

/// `full_append` / `incremental_append`: every staged row, appended.
pub fn insert_select(destination: &TableRef<'_>, staging: &TableRef<'_>, columns: &[Column]) -> String {
    let list = column_list(columns);
    format!("INSERT INTO {} ({list})\nSELECT {list}\nFROM {}", destination.quoted(), staging.quoted())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::schema::BigQueryType;

    fn columns() -> Vec<Column> {
        vec![
            Column { name: "id".into(), bigquery_type: BigQueryType::Int64 },
            Column { name: "name".into(), bigquery_type: BigQueryType::String },
            Column { name: "updated_at".into(), bigquery_type: BigQueryType::Timestamp },
        ]
    }

    #[test]
    fn append_modes_insert_every_staged_row() {
        let sql = insert_select(
            &TableRef { project: "my-project", dataset: "raw", table: "users" },
            &TableRef { project: "my-project", dataset: "raw", table: "_filament_stg_users_0123456789abcdef" },
            &columns(),
        );
        insta::assert_snapshot!(sql);
    }

    #[test]
    fn quoting_escapes_what_validation_should_have_rejected() {
        assert_eq!(quote_identifier("a`b"), "`a\\`b`");
        assert_eq!(quote_identifier("a\\b"), "`a\\\\b`");
        assert_eq!(TableRef { project: "example.com:p", dataset: "d", table: "t" }.quoted(), "`example.com:p`.`d`.`t`");
    }
}
