//! The benchmarks' generated sections of `docs/performance.md`: each lies between its own
//! `<!-- NAME:begin -->` and `<!-- NAME:end -->` markers and is replaced whole; the analysis
//! around it stays.

use std::path::Path;

/// Replaces the section `name` of the document at `path` with `markdown` (appended, with its
/// markers, when the document has none yet).
pub fn replace_section(path: &Path, name: &str, markdown: &str) {
    let (begin, end) = (format!("<!-- {name}:begin -->"), format!("<!-- {name}:end -->"));
    let current = std::fs::read_to_string(path).unwrap_or_default();
    let updated = match (current.find(&begin), current.find(&end)) {
        (Some(b), Some(e)) if b < e => format!("{}{begin}\n{markdown}{}", &current[..b], &current[e..]),
        _ => format!("{current}\n{begin}\n{markdown}{end}\n"),
    };
    std::fs::write(path, updated).unwrap();
}
