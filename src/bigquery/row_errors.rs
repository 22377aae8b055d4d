//! What BigQuery's row errors and query jobs' errors may say: their messages can quote the
//! refused value (a job's, a staged value it converted), and the execution's error is stored in
//! Postgres and shown in the API, the console and logs, so the quoted values are removed first
//! ([`without_row_values`]).

/// The longest row-error message kept (after redaction).
const MAX_ROW_ERROR_CHARS: usize = 200;

/// A BigQuery row-error message without the row values it may quote: BigQuery quotes a value
/// it refused in double or single quotes (`Invalid date: "2024-13-01"`, `Could not parse 'abc'
/// as INT64`), while column names are backquoted or bare. Every quoted span becomes `"…"`, an
/// unclosed quote hides the rest, and the message is cut to [`MAX_ROW_ERROR_CHARS`]: the row's
/// index, the column and the kind of error stay, for the extractor to find the row.
pub(crate) fn without_row_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_ROW_ERROR_CHARS));
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        if c == '"' || c == '\'' {
            out.push_str("\"…\"");
            // Skip to the closing quote (escaped quotes inside included), or to the end.
            let mut escaped = false;
            for inner in chars.by_ref() {
                if inner == c && !escaped {
                    break;
                }
                escaped = inner == '\\' && !escaped;
            }
        } else {
            out.push(c);
        }
        if out.chars().count() >= MAX_ROW_ERROR_CHARS {
            out.push('…');
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_are_removed_and_the_column_and_error_kept() {
        assert_eq!(
            without_row_values("Field value of `amount` cannot be converted: 'SECRET-42' is not NUMERIC"),
            "Field value of `amount` cannot be converted: \"…\" is not NUMERIC"
        );
        assert_eq!(without_row_values(r#"Invalid date: "2024-13-01" in column d"#), "Invalid date: \"…\" in column d");
        assert_eq!(without_row_values(r#"bad "a \"quoted\" value" here"#), "bad \"…\" here", "escaped quotes inside");
        assert_eq!(without_row_values("unterminated 'secret value"), "unterminated \"…\"");
        assert_eq!(without_row_values("no value here"), "no value here");
        let long = without_row_values(&"x".repeat(1000));
        assert_eq!(long.chars().count(), MAX_ROW_ERROR_CHARS + 1, "cut, with an ellipsis");
    }
}
