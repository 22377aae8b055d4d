//! Which way a lane's rows reach their destination table, decided once at set-up: through a
//! staging table read by the publication's query job (the default), or, for a resource
//! declared `direct_append` (an append mode without metadata columns, checked at declaration
//! by `model::write_options`), straight into the destination's own PENDING stream, which the
//! publication commits with `BatchCommitWriteStreams` (`publish::direct`).
//!
//! A direct write commits the staged rows as they are: it applies only when the publication's
//! `INSERT ... SELECT` would copy every staged column unchanged into a column of the same name.
//! A value staged in another form (TIME, NUMERIC, BIGNUMERIC, JSON, RANGE, INTERVAL and text
//! GEOGRAPHY travel as strings), a flexible name staged under a derived one, or a value cast
//! into an existing table's wider column needs the query; so does a staged column the table
//! does not take. Then the resource loads through staging and its timeline says why.

use crate::model::columns::Column;
use crate::model::staging::WritePath;
use crate::model::write_options::DeclaredPath;

/// Set-up's choice of a lane's write path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chosen {
    pub(crate) path: WritePath,
    /// Why a resource declared `direct_append` loads through staging all the same.
    pub(crate) declined: Option<String>,
}

/// The path of a lane whose resource declared `declared`, staging `staging_columns` (into
/// `staging_table`, on the staging path), which the destination takes as `published`
/// (set-up's answer: the staged columns with their casts into the existing table's types)
/// once the publication has widened the columns `widened_at_publication` names.
pub(crate) fn choose(
    declared: DeclaredPath,
    staging_table: &str,
    staging_columns: &[Column],
    published: &[Column],
    widened_at_publication: &[String],
) -> Chosen {
    let staging = |declined| Chosen { path: WritePath::Staging { staging_table: staging_table.to_string() }, declined };
    if declared == DeclaredPath::Staging {
        return staging(None);
    }
    if let Some(column) = widened_at_publication.first() {
        return staging(Some(format!("column {column} is widened by the publication, after the commit")));
    }
    match why_not_direct(staging_columns, published) {
        Some(reason) => staging(Some(reason)),
        None => Chosen { path: WritePath::Direct, declined: None },
    }
}

/// Why the staged rows cannot be committed into the destination as they are; `None` when they can.
fn why_not_direct(staging_columns: &[Column], published: &[Column]) -> Option<String> {
    if let Some(column) = published.iter().find(|c| c.published_as.is_some()) {
        return Some(format!("column {} is cast into the table's wider type by the publication query", column.name));
    }
    if let Some(column) = published.iter().find(|c| c.staged_name() != c.name) {
        return Some(format!("column {} has a flexible name, staged under another one", column.name));
    }
    if let Some(column) = published.iter().find(|c| c.needs_conversion()) {
        return Some(format!(
            "column {} is {}, staged in another form and converted by the publication query",
            column.name,
            column.bigquery_type.type_name()
        ));
    }
    let taken = |staged: &&Column| published.iter().any(|c| c.name == staged.name);
    if let Some(staged) = staging_columns.iter().find(|staged| !taken(staged)) {
        return Some(format!("the staged rows carry {}, which the table does not take", staged.name));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::columns::BigQueryType;

    fn columns() -> Vec<Column> {
        vec![Column::new("id", BigQueryType::Int64), Column::new("name", BigQueryType::String)]
    }

    /// The choice of a lane declared `direct_append`.
    fn direct(staging_columns: &[Column], published: &[Column], widened: &[String]) -> Chosen {
        choose(DeclaredPath::Direct, "stg", staging_columns, published, widened)
    }

    fn staging() -> WritePath {
        WritePath::Staging { staging_table: "stg".to_string() }
    }

    fn declined(chosen: Chosen) -> String {
        match chosen {
            Chosen { path, declined: Some(reason) } if path == staging() => reason,
            other => panic!("expected a declined direct append, got {other:?}"),
        }
    }

    #[test]
    fn columns_that_go_in_as_sent_are_written_directly() {
        assert_eq!(direct(&columns(), &columns(), &[]), Chosen { path: WritePath::Direct, declined: None });
    }

    #[test]
    fn without_the_declaration_rows_go_through_staging_with_no_reason() {
        let chosen = choose(DeclaredPath::Staging, "stg", &columns(), &columns(), &[]);
        assert_eq!(chosen, Chosen { path: staging(), declined: None });
    }

    #[test]
    fn a_value_staged_as_a_string_needs_the_query() {
        let mut published = columns();
        published.push(Column::new("balance", BigQueryType::Numeric));
        let staged: Vec<Column> = published.iter().map(Column::staged).collect();
        let reason = declined(direct(&staged, &published, &[]));
        assert!(reason.contains("balance is NUMERIC"), "{reason}");
    }

    #[test]
    fn a_cast_into_a_wider_column_needs_the_query() {
        let mut published = columns();
        published[0].published_as = Some(BigQueryType::Numeric);
        let reason = declined(direct(&columns(), &published, &[]));
        assert!(reason.contains("id is cast"), "{reason}");
    }

    #[test]
    fn a_column_the_publication_widens_needs_the_query() {
        let reason = declined(direct(&columns(), &columns(), &["id".to_string()]));
        assert!(reason.contains("id is widened by the publication"), "{reason}");
    }

    #[test]
    fn a_flexible_name_needs_the_query() {
        let published = vec![Column::new("unit price", BigQueryType::Float64)];
        let staged: Vec<Column> = published.iter().map(Column::staged).collect();
        let reason = declined(direct(&staged, &published, &[]));
        assert!(reason.contains("flexible name"), "{reason}");
    }

    #[test]
    fn a_staged_column_the_table_does_not_take_needs_the_query() {
        let mut staged = columns();
        staged.push(Column::new("_filament_seq", BigQueryType::Int64));
        let reason = declined(direct(&staged, &columns(), &[]));
        assert!(reason.contains("_filament_seq"), "{reason}");
    }
}
