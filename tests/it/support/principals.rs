//! A principals file written by the test (`FILAMENT_PRINCIPALS_FILE`), and tokens for it.

use sha2::{Digest as _, Sha256};

use super::random_suffix;

/// A token of the `fbq_` shape `token new` prints.
pub fn new_token() -> String {
    format!("fbq_{}{}", random_suffix(), random_suffix())
}

/// The hex SHA-256 of `token`, as the file lists it.
pub fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// One `[[principal]]` table: `name`, its tokens (digested here) and further TOML lines.
pub fn entry(name: &str, tokens: &[&str], extra: &str) -> String {
    let digests: Vec<String> = tokens.iter().map(|t| format!("\"{}\"", digest(t))).collect();
    format!("[[principal]]\nname = \"{name}\"\ntoken_sha256 = [{}]\n{extra}\n\n", digests.join(", "))
}

/// The file, in the test's temporary directory.
pub struct PrincipalsFile {
    pub path: std::path::PathBuf,
}

impl PrincipalsFile {
    pub fn new(entries: &[String]) -> Self {
        let path =
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("principals-{}.toml", random_suffix()));
        let file = Self { path };
        file.write(entries);
        file
    }

    /// Replaces the file's content at once (written aside, then renamed over it).
    pub fn write(&self, entries: &[String]) {
        self.write_text(&entries.concat());
    }

    pub fn write_text(&self, text: &str) {
        let aside = self.path.with_extension("new");
        std::fs::write(&aside, text).unwrap();
        std::fs::rename(&aside, &self.path).unwrap();
    }

    pub fn env(&self) -> (&'static str, String) {
        ("FILAMENT_PRINCIPALS_FILE", self.path.display().to_string())
    }
}
