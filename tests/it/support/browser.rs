//! A real headless Chromium, driven over the W3C WebDriver protocol through
//! `chromedriver` (Debian's `chromium` and `chromium-driver` packages,
//! which `scripts/test.sh` installs). The driver runs in its own process
//! group on a free loopback port, with a profile in a temp dir; both go
//! when the browser is dropped.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use super::free_port;
use super::process::OwnedProcess;

/// Where Debian installs the browser and its driver.
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The key of an element reference in WebDriver answers.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// One browser session.
pub struct Browser {
    _driver: OwnedProcess,
    _profile: tempfile::TempDir,
    session: String,
    http: reqwest::Client,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session (1280×900).
    /// Panics, naming the package, when either is missing: a console test
    /// never passes by skipping.
    pub async fn start() -> Browser {
        for (path, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
            assert!(
                Path::new(path).exists(),
                "{path} is missing: install Debian's `{package}` (scripts/test.sh does)"
            );
        }
        let port = free_port();
        let mut command = Command::new(CHROMEDRIVER);
        command
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(std::process::Stdio::null());
        let driver = OwnedProcess::spawn(command, "chromedriver");
        let profile = tempfile::tempdir().expect("a temp dir for the browser profile");
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        super::wait_until("chromedriver answers", Duration::from_secs(20), || {
            let http = http.clone();
            let base = base.clone();
            async move { http.get(format!("{base}/status")).send().await.is_ok() }
        })
        .await;
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--window-size=1280,900",
                    "--no-first-run", "--no-default-browser-check",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let answer: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("POST /session")
            .json()
            .await
            .expect("session JSON");
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromedriver started no session: {answer}"))
            .to_string();
        Browser {
            _driver: driver,
            _profile: profile,
            session: format!("{base}/session/{session}"),
            http,
        }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        request = request.json(&body.unwrap_or_else(|| json!({})));
        let answer: Value = request
            .send()
            .await
            .expect("WebDriver request")
            .json()
            .await
            .expect("WebDriver JSON");
        answer["value"].clone()
    }

    /// Opens `url` (and waits for its load).
    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// The element matching `css` now, if any.
    async fn find(&self, css: &str) -> Option<String> {
        let found = self
            .command(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        // An element reference (W3C); an error answers {"error": ...}.
        found[ELEMENT_KEY].as_str().map(str::to_string)
    }

    /// Waits (10 s at most) for an element matching `css`; its id.
    pub async fn wait_for(&self, css: &str) -> String {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(id) = self.find(css).await {
                return id;
            }
            assert!(
                std::time::Instant::now() < until,
                "no `{css}` on the page within 10 s; the page shows:\n{}",
                self.eval("return document.body.innerText").await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (10 s at most) until the text of `css` satisfies `ok`; the text.
    pub async fn wait_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = self.text(css).await.unwrap_or_default();
            if ok(&text) {
                return text;
            }
            assert!(
                std::time::Instant::now() < until,
                "`{css}` never showed the expected text; last: {text:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether an element matches `css` now.
    pub async fn exists(&self, css: &str) -> bool {
        self.find(css).await.is_some()
    }

    /// The rendered text of the first element matching `css`.
    pub async fn text(&self, css: &str) -> Option<String> {
        let id = self.find(css).await?;
        self.command(reqwest::Method::GET, &format!("/element/{id}/text"), None)
            .await
            .as_str()
            .map(str::to_string)
    }

    /// Clicks the element matching `css` (waiting for it).
    pub async fn click(&self, css: &str) {
        let id = self.wait_for(css).await;
        self.command(reqwest::Method::POST, &format!("/element/{id}/click"), None)
            .await;
    }

    /// Types `text` into the element matching `css` (waiting for it).
    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.wait_for(css).await;
        self.command(reqwest::Method::POST, &format!("/element/{id}/clear"), None)
            .await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    /// Runs `script` (a function body) in the page; its return value.
    pub async fn eval(&self, script: &str) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Runs `script` (a function body whose last argument is the callback)
    /// in the page and waits for what it passes to the callback.
    pub async fn eval_async(&self, script: &str) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/async",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Saves a PNG of the window to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let data = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().expect("base64 screenshot"))
            .expect("a PNG");
        std::fs::write(path, png).expect("write the screenshot");
    }
}
