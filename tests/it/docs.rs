//! The documentation holds together: every relative link of `README.md`,
//! `ARCHITECTURE.md` and `docs/*.md` points at a file of the repository and,
//! with a `#anchor`, at a heading of that file (GitHub's slugs); every docs
//! page links back to the README and is linked from it; the README stays
//! short; and the quick start's receiver (`scripts/receiver.py`) verifies
//! what hookq signs, with Python's standard library alone and with the
//! official library, and refuses forgeries. No network: external `http(s)`
//! links are not fetched.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use crate::support::process::OwnedProcess;
use crate::support::redis::RedisServer;
use crate::{job_view, post_created, start_daemon, test_config};

/// The README's length bound (issue 38: what hookq is, how to start, where
/// to read on; the rest lives in `docs/`).
const README_MAX_LINES: usize = 250;

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `docs/*.md`, sorted.
fn docs_pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    pages
}

/// Every Markdown file whose links are checked.
fn checked_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let architecture = root().join("ARCHITECTURE.md");
    if architecture.exists() {
        files.push(architecture);
    }
    files.extend(docs_pages());
    files
}

/// The lines of `text` outside fenced code blocks, numbered from 1, with
/// inline code spans removed (a `[[hosts]]` or `](` in code is no link).
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let outside_code: String = line
            .split('`')
            .enumerate()
            .filter(|(k, _)| k % 2 == 0)
            .map(|(_, part)| part)
            .collect();
        lines.push((i + 1, outside_code));
    }
    lines
}

/// The targets of the inline links and images of `text`, with their line
/// numbers: what stands between `](` and the next `)`, an optional title cut.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let mut targets = Vec::new();
    for (number, line) in prose_lines(text) {
        let mut rest = line.as_str();
        while let Some(start) = rest.find("](") {
            rest = &rest[start + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            targets.push((number, target.to_string()));
            rest = &rest[end..];
        }
    }
    targets
}

/// GitHub's anchor of a heading: lower case, every character but letters,
/// digits, `-`, `_` and spaces dropped, spaces turned into `-`; a repeated
/// slug gets `-1`, `-2`, ...
fn heading_slugs(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut slugs = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if in_fence || hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let slug: String = line[hashes..]
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        slugs.push(if *count == 0 {
            slug
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    slugs
}

/// What is wrong with `target`, a link of `file`, or None when it leads
/// somewhere: the file (or directory) exists, and an anchor is a heading of it.
fn broken(file: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("empty link".into());
    }
    if target.starts_with("http://") || target.starts_with("https://") {
        return None;
    }
    if target.contains("://") || target.starts_with("mailto:") {
        return Some("a scheme other than http(s)".into());
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let resolved = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().expect("a file has a directory").join(path)
    };
    if !resolved.exists() {
        return Some(format!("{} does not exist", resolved.display()));
    }
    let anchor = anchor?;
    if resolved.extension().is_none_or(|ext| ext != "md") {
        return Some("an anchor into a file that is not Markdown".into());
    }
    let text = std::fs::read_to_string(&resolved).expect("a linked page is readable");
    let slugs = heading_slugs(&text);
    if slugs.iter().any(|slug| slug == anchor) {
        None
    } else {
        Some(format!(
            "no heading of {} has the slug {anchor:?} (its slugs: {slugs:?})",
            resolved.display()
        ))
    }
}

/// A file's name relative to the repository, for messages.
fn shown(file: &Path) -> String {
    file.strip_prefix(root())
        .unwrap_or(file)
        .display()
        .to_string()
}

#[test]
fn every_relative_link_leads_to_a_file_and_heading() {
    let mut problems = Vec::new();
    let mut relative_links = 0;
    for file in checked_files() {
        let text = std::fs::read_to_string(&file).expect("a doc is readable");
        for (line, target) in link_targets(&text) {
            if !target.starts_with("http://") && !target.starts_with("https://") {
                relative_links += 1;
            }
            if let Some(problem) = broken(&file, &target) {
                problems.push(format!("{}:{line}: ({target}): {problem}", shown(&file)));
            }
        }
    }
    // The README alone links every docs page: a checker that found fewer
    // links than that would be reading nothing.
    assert!(
        relative_links > docs_pages().len(),
        "only {relative_links} relative links found"
    );
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_docs_page_links_back_to_the_readme_and_the_readme_to_it() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let readme_targets: Vec<String> = link_targets(&readme)
        .into_iter()
        .map(|(_, target)| target)
        .collect();
    let mut problems = Vec::new();
    for page in docs_pages() {
        let text = std::fs::read_to_string(&page).expect("a docs page is readable");
        let back = link_targets(&text)
            .iter()
            .any(|(_, target)| target.split('#').next() == Some("../README.md"));
        if !back {
            problems.push(format!("{} has no link to ../README.md", shown(&page)));
        }
        if !text.starts_with("# ") {
            problems.push(format!("{} does not open with a `# Title`", shown(&page)));
        }
        let name = shown(&page);
        let linked = readme_targets
            .iter()
            .any(|target| target.split('#').next() == Some(name.as_str()));
        if !linked {
            problems.push(format!("README.md does not link {name}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_readme_stays_within_250_lines() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move detail into docs/"
    );
}

#[test]
fn slugs_follow_githubs_rules() {
    let text = "# Scale-out: many daemons, Redis Cluster\n## A job's path\n\
                ```sh\n# a comment, no heading\n```\n### `hookq doctor`\n## A job's path\n#no heading\n";
    assert_eq!(
        heading_slugs(text),
        [
            "scale-out-many-daemons-redis-cluster",
            "a-jobs-path",
            "hookq-doctor",
            "a-jobs-path-1"
        ]
    );
}

/// The quick start's signing secret: `whsec_` and 32 bytes, base64.
const QUICK_START_KEY: [u8; 32] = *b"quick-start-secret-32-bytes-long";

/// `scripts/receiver.py PORT SECRET` on a free port, run by `python3` with
/// `python_args`, its stdout into `receiver-<port>.out` in `dir`; returns
/// it, its port and that file once it listens. A port another process took
/// between its pick and the receiver's bind (a parallel test's connection
/// may) is picked again.
async fn start_receiver(
    python_args: &[&str],
    secret: &str,
    dir: &Path,
) -> (OwnedProcess, u16, PathBuf) {
    for _ in 0..5 {
        let port = crate::support::free_port();
        let out = dir.join(format!("receiver-{port}.out"));
        let mut command = Command::new("python3");
        command
            .args(python_args)
            .arg(root().join("scripts/receiver.py"))
            .arg(port.to_string())
            .arg(secret)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("create the receiver's stdout file"));
        let mut receiver = OwnedProcess::spawn(command, "scripts/receiver.py");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if std::fs::read_to_string(&out).is_ok_and(|text| text.contains("receiver listening")) {
                return (receiver, port, out);
            }
            if receiver.try_wait().is_some() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after 20s waiting until the receiver listens"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    panic!("scripts/receiver.py exited before listening on five free ports in turn");
}

/// A Standard Webhooks `v1,<base64>` signature of `id`, `timestamp`, `body`.
fn v1_signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// The status the receiver on `port` answers a POST of `body` with these
/// Standard Webhooks headers.
async fn post_signed(port: u16, id: &str, timestamp: i64, signature: &str, body: &[u8]) -> u16 {
    reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/hooks/paid"))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body.to_vec())
        .send()
        .await
        .expect("the receiver answers")
        .status()
        .as_u16()
}

/// The quick start on a stock Python: `python3 -S` (no site-packages, so no
/// `standardwebhooks`, as on a Debian system Python) verifies a job hookq
/// delivers with the standard library alone, and a `python3` with the
/// official library (which `scripts/test.sh` installs) verifies it with
/// both. Each refuses, 401, a signature by another key, a changed body and
/// a correctly signed timestamp 6 minutes old.
#[tokio::test]
async fn the_quick_start_receiver_verifies_hookqs_signatures_and_refuses_forgeries() {
    let secret = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(QUICK_START_KEY)
    );
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.delivery.signing_secrets = vec![secret.clone()];
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let dir = tempfile::tempdir().expect("a temp dir for the receivers' output");

    for (python_args, checks) in [
        (&["-S"][..], "verified (stdlib)"),
        (&[][..], "verified (stdlib, standardwebhooks)"),
    ] {
        let (_receiver, port, out) = start_receiver(python_args, &secret, dir.path()).await;
        let id = format!("order-42-paid-{port}");
        post_created(
            &format!("{base}/v1/jobs"),
            json!({"id": id, "url": format!("http://127.0.0.1:{port}/hooks/paid"), "body": {"order": 42}}),
        )
        .await;
        // The test ladder is two short rungs: a receiver that refuses the
        // signature dead-letters the job within a second or so.
        crate::support::wait_until("the job is finished", Duration::from_secs(30), || async {
            let state = job_view(&base, &id).await["state"].clone();
            state == "delivered" || state == "dead"
        })
        .await;
        let printed = std::fs::read_to_string(&out).expect("the receiver's output");
        assert_eq!(
            job_view(&base, &id).await["state"],
            "delivered",
            "python3 {python_args:?} refused hookq's signature:\n{printed}"
        );
        assert!(
            printed.contains(&format!(
                "{checks}: webhook-id {id} attempt 1 body {{\"order\":42}}"
            )),
            "python3 {python_args:?} printed:\n{printed}"
        );

        let body = br#"{"order": 42}"#;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs() as i64;
        let good = v1_signature(&QUICK_START_KEY, "probe", now, body);
        assert_eq!(
            post_signed(port, "probe", now, &good, body).await,
            204,
            "{python_args:?}"
        );
        let other_key = v1_signature(b"another-secret-of-32-bytes-long!", "probe", now, body);
        assert_eq!(
            post_signed(port, "probe", now, &other_key, body).await,
            401,
            "{python_args:?}: another key"
        );
        let changed = br#"{"order": 4200}"#;
        assert_eq!(
            post_signed(port, "probe", now, &good, changed).await,
            401,
            "{python_args:?}: a changed body"
        );
        let old = now - 6 * 60;
        let signed_old = v1_signature(&QUICK_START_KEY, "probe", old, body);
        assert_eq!(
            post_signed(port, "probe", old, &signed_old, body).await,
            401,
            "{python_args:?}: 6 minutes old"
        );
    }
    daemon.stop().await.expect("clean stop");
}
