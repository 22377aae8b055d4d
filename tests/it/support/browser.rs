//! A real browser for the console's tests: Debian's headless Chromium driven over WebDriver
//! (`chromedriver`, through fantoccini), one browser per test with its own profile, so
//! cookies never leak between tests. `scripts/system-deps.sh` installs both; the paths can be
//! set with `FILAMENT_CHROMEDRIVER` and `FILAMENT_CHROMIUM`. Screenshots are saved under
//! `build/console-screenshots/` for a person to look at.

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

/// How long a page may take to show what a test waits for.
pub const PAGE_DEADLINE: Duration = Duration::from_secs(30);

/// One headless Chromium and its chromedriver; both end on drop.
pub struct Browser {
    pub client: Client,
    _driver: Driver,
    _profile: tempfile::TempDir,
}

/// chromedriver in a process group of its own, ended with every browser it started when
/// dropped (also when a test panics before its session exists).
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", "--", &format!("-{}", self.0.id())]).status();
        let _ = self.0.wait();
    }
}

impl Browser {
    pub async fn start() -> Self {
        let chromedriver = std::env::var("FILAMENT_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let chromium = std::env::var("FILAMENT_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let port = super::free_port_for_later_bind();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            // Its own process group, so the browsers it starts end with it (on drop).
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("starting {chromedriver} (scripts/system-deps.sh installs chromium-driver): {e}")
            });
        let mut driver = Driver(driver);
        let profile = tempfile::tempdir().expect("a browser profile directory");
        let capabilities = json!({"goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", format!("--user-data-dir={}", profile.path().display())],
        }});
        let capabilities = match capabilities {
            serde_json::Value::Object(map) => map,
            _ => unreachable!("an object literal"),
        };
        let url = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + PAGE_DEADLINE;
        let client = loop {
            let mut builder = ClientBuilder::rustls().expect("TLS roots for the WebDriver client");
            match builder.capabilities(capabilities.clone()).connect(&url).await {
                Ok(client) => break client,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    if let Ok(Some(status)) = driver.0.try_wait() {
                        panic!("chromedriver exited with {status}: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("no WebDriver session from {chromedriver} within {PAGE_DEADLINE:?}: {e}"),
            }
        };
        Self { client, _driver: driver, _profile: profile }
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap_or_else(|e| panic!("navigating to {url}: {e}"));
    }

    /// The text of the first element `css` selects, once the page has one (the page may be
    /// reloading itself meanwhile).
    pub async fn text(&self, css: &str) -> String {
        let deadline = tokio::time::Instant::now() + PAGE_DEADLINE;
        loop {
            let found = match self.client.find(Locator::Css(css)).await {
                Ok(element) => element.text().await.ok(),
                Err(_) => None,
            };
            match found {
                Some(text) => return text,
                None if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                None => panic!("no {css} on the page within {PAGE_DEADLINE:?}:\n{}", self.source().await),
            }
        }
    }

    /// Waits, with a deadline, until the text of `css` satisfies `probe`; that text.
    pub async fn wait_for_text(&self, css: &str, what: &str, probe: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + PAGE_DEADLINE;
        loop {
            let text = self.text(css).await;
            if probe(&text) {
                return text;
            }
            assert!(tokio::time::Instant::now() < deadline, "{what}: {css} still shows {text:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn source(&self) -> String {
        self.client.source().await.unwrap_or_default()
    }

    /// Fills the sign-in form with `token`, submits it and waits for the signed-in page.
    pub async fn sign_in(&self, token: &str) {
        let form = self.client.form(Locator::Css("form.sign-in")).await.expect("the sign-in form");
        form.set_by_name("token", token).await.expect("typing the token");
        form.submit_with(Locator::Css("#sign-in")).await.expect("submitting the sign-in form");
        // The answer (303 to the runs list) must have loaded before the test navigates on:
        // otherwise the redirect can land after the next `goto` and replace its page.
        self.text("#principal").await;
    }

    /// Saves a screenshot of the page as `build/console-screenshots/{name}.png`.
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("a screenshot");
        let directory = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("build/console-screenshots");
        std::fs::create_dir_all(&directory).expect("build/console-screenshots");
        std::fs::write(directory.join(format!("{name}.png")), png).expect("saving the screenshot");
    }

    /// Ends the WebDriver session (Chromium quits); chromedriver ends on drop.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}
