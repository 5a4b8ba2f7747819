//! The docs cannot drift from the code: every relative link in README.md and
//! docs/ resolves (anchors too); every log line docs/runbooks.md quotes is
//! printed by src/; every shipped alert has its runbook section;
//! docs/metrics-and-events.md lists exactly the metrics a running janitor
//! exports (scraped from the real binary on the real control plane) and the
//! Event reasons of src/events.rs; docs/how-it-decides.md names every reason
//! word; the chart's README is what helm-docs generates from values.yaml.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::Api;
use lock_janitor_testenv::{fresh_namespace, kubelet, shared};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// The markdown files a reader follows: README.md, docs/*.md, the chart's.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("charts/lock-janitor/README.md"),
    ];
    for e in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            files.push(p);
        }
    }
    files.sort();
    files
}

/// GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to '-'.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// `(text, target)` of every inline link `[text](target)` outside code.
fn links(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

/// Files a link may name before they exist (written on another branch);
/// checked like any other once they are here. docs/install.md was one.
const PENDING: &[&str] = &[];

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let dir = file.parent().unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            let rel = dest.canonicalize().ok().and_then(|d| {
                d.strip_prefix(root().canonicalize().unwrap())
                    .ok()
                    .map(Path::to_path_buf)
            });
            let Some(rel) = rel else {
                let pending = PENDING.iter().any(|p| root().join(p) == normalize(&dest));
                if !pending {
                    broken.push(format!("{}: {target} (no such file)", file.display()));
                }
                continue;
            };
            if !anchor.is_empty() {
                let text = std::fs::read_to_string(root().join(&rel)).unwrap_or_default();
                if !anchors(&text).contains(anchor) {
                    broken.push(format!(
                        "{}: {target} (no heading #{anchor})",
                        file.display()
                    ));
                }
            }
        }
    }
    assert!(
        checked > 30,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `a/b/../c` to `a/c`, without touching the file system.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Every string literal of the Rust files under `dir`, whitespace collapsed
/// (a literal continued with `\` at a line end reads as one line).
fn string_literals(dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            string_literals(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let src = std::fs::read_to_string(&p).unwrap();
            let mut chars = src.chars().peekable();
            let mut prev = ' ';
            while let Some(c) = chars.next() {
                // Raw strings: r"..." and r#"..."# (they may hold quotes).
                if c == 'r'
                    && matches!(chars.peek(), Some('#' | '"'))
                    && !(prev.is_alphanumeric() || prev == '_')
                {
                    let mut hashes = 0;
                    while chars.peek() == Some(&'#') {
                        chars.next();
                        hashes += 1;
                    }
                    if chars.next() != Some('"') {
                        prev = '#';
                        continue;
                    }
                    let close = format!("\"{}", "#".repeat(hashes));
                    let mut lit = String::new();
                    for c in chars.by_ref() {
                        lit.push(c);
                        if lit.ends_with(&close) {
                            lit.truncate(lit.len() - close.len());
                            break;
                        }
                    }
                    out.push(collapse(&lit));
                    prev = '"';
                    continue;
                }
                // Skip line comments, and chars like '"'.
                if c == '/' && chars.peek() == Some(&'/') {
                    for c in chars.by_ref() {
                        if c == '\n' {
                            break;
                        }
                    }
                    prev = '\n';
                    continue;
                }
                if c == '\'' {
                    let look: String = chars.clone().take(3).collect();
                    if look.starts_with("\"'") || look.starts_with("\\\"'") {
                        for _ in 0..look.find('\'').unwrap() + 1 {
                            chars.next();
                        }
                        continue;
                    }
                }
                if c == '"' {
                    let mut lit = String::new();
                    while let Some(c) = chars.next() {
                        match c {
                            '\\' => match chars.next() {
                                Some('\n') => {
                                    while chars.peek().is_some_and(|c| c.is_whitespace()) {
                                        chars.next();
                                    }
                                }
                                Some('n') => lit.push(' '),
                                Some(other) => lit.push(other),
                                None => break,
                            },
                            '"' => break,
                            c => lit.push(c),
                        }
                    }
                    out.push(collapse(&lit));
                }
                prev = c;
            }
        }
    }
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The log lines a page quotes: `grep -F '...'` patterns without shell
/// variables, and code spans right after "log", "logs", "logged", "log
/// line", "log says" or "logged as".
fn quoted_log_lines(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for q in ['\'', '"'] {
        let needle = format!("grep -F {q}");
        let mut rest = text;
        while let Some(i) = rest.find(&needle) {
            let after = &rest[i + needle.len()..];
            let end = after.find(q).expect("closing quote");
            let pat = &after[..end];
            if !pat.contains('$') && !pat.starts_with("lock_janitor_") {
                out.insert(collapse(pat));
            }
            rest = &after[end..];
        }
    }
    let flat = collapse(text);
    for lead in [
        "log `",
        "logs `",
        "logged `",
        "log line `",
        "log says `",
        "logged as `",
    ] {
        let mut rest = flat.as_str();
        while let Some(i) = rest.find(lead) {
            let after = &rest[i + lead.len()..];
            let end = after.find('`').expect("closing backtick");
            out.insert(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_quoted_log_line_is_printed_by_the_code() {
    let mut literals = Vec::new();
    string_literals(&root().join("src"), &mut literals);
    assert!(literals.iter().any(|l| l == "stale lock reclaimed"));
    let mut missing = Vec::new();
    let mut seen = 0;
    for page in ["docs/runbooks.md", "README.md", "docs/install.md"] {
        for line in quoted_log_lines(&read(page)) {
            seen += 1;
            if !literals.iter().any(|l| l.contains(&line)) {
                missing.push(format!("{page}: {line:?}"));
            }
        }
    }
    assert!(
        seen >= 12,
        "only {seen} quoted log lines: is the parser broken?"
    );
    assert!(
        missing.is_empty(),
        "quoted log lines the code never prints:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_quote_finder_finds_what_it_should() {
    let page = "The leader logs `stale lock\n reclaimed` and\n\n```sh\nkubectl logs | grep -F 'watch failing' | grep -F \"$LOCK\"\n```\n";
    assert_eq!(
        quoted_log_lines(page),
        BTreeSet::from([
            "stale lock reclaimed".to_owned(),
            "watch failing".to_owned()
        ])
    );
    let mut lits = Vec::new();
    let dir = std::env::temp_dir().join(format!("docs-lits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("a.rs"),
        "// \"not this\"\nlet c = '\"'; warn!(\"could not \\\n     carry it\"); let s = \"a\\\"b\";\n",
    )
    .unwrap();
    string_literals(&dir, &mut lits);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(lits, ["could not carry it", "a\"b"]);
}

#[test]
fn every_alert_has_a_runbook_section() {
    let rules: serde_json::Value =
        serde_saphyr::from_str(&read("charts/lock-janitor/files/prometheus-rules.yaml"))
            .expect("rules parse");
    let runbooks = read("docs/runbooks.md");
    let sections = anchors(&runbooks);
    let mut alerts = Vec::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let Some(alert) = rule["alert"].as_str() else {
                continue;
            };
            alerts.push(alert.to_owned());
            assert!(
                runbooks.contains(&format!("\n## {alert}\n")),
                "docs/runbooks.md has no section ## {alert}"
            );
            for part in ["Meaning", "Impact", "Diagnosis", "Mitigation"] {
                let section = runbooks.split(&format!("\n## {alert}\n")).nth(1).unwrap();
                let section = section.split("\n## ").next().unwrap();
                assert!(
                    section.contains(&format!("### {part}")),
                    "{alert}: no ### {part}"
                );
            }
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_default();
            let anchor = url.rsplit_once('#').map(|(_, a)| a).unwrap_or_default();
            assert!(
                url.contains("docs/runbooks.md#") && sections.contains(anchor),
                "{alert}: runbook_url {url:?} points at no section"
            );
        }
    }
    assert_eq!(alerts.len(), 10, "{alerts:?}");
    // And no section for an alert that is not shipped.
    for heading in runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## LockJanitor"))
    {
        let name = format!("LockJanitor{heading}");
        assert!(
            alerts.contains(&name),
            "runbook section for unknown alert {name}"
        );
    }
}

/// The backticked first cells of the table rows of `section`, up to the
/// next heading (so "### Pending" under "## Metrics" is not read).
fn table_names(page: &str, section: &str, prefix: &str) -> BTreeSet<String> {
    let body = page
        .split(&format!("\n{section}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("no {section}"));
    body.lines()
        .take_while(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(n, _)| n.to_owned()))
        .filter(|n| n.starts_with(prefix))
        .collect()
}

#[test]
fn events_listed_are_the_reasons_of_the_code() {
    let code: BTreeSet<String> = read("src/events.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("pub const REASON_"))
        .filter_map(|l| l.split('"').nth(1).map(str::to_owned))
        .collect();
    assert_eq!(code.len(), 11, "{code:?}");
    let page = read("docs/metrics-and-events.md");
    assert_eq!(table_names(&page, "## Events", ""), code);
}

#[test]
fn every_reason_word_is_explained() {
    let mut words = BTreeSet::new();
    let grab = |text: &str, words: &mut BTreeSet<String>, after: &str| {
        for l in text.lines() {
            if let Some((_, rest)) = l.split_once(after) {
                if let Some(w) = rest.split('"').nth(1) {
                    if w.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                        && w.chars().all(|c| c.is_ascii_alphanumeric())
                    {
                        words.insert(w.to_owned());
                    }
                }
            }
        }
    };
    // Why held (words.rs), stale reasons (verdict), unmanageable codes (lock).
    grab(&read("src/words.rs"), &mut words, "=> ");
    grab(&read("src/verdict/mod.rs"), &mut words, "=> ");
    grab(&read("src/lock/mod.rs"), &mut words, "=> ");
    for w in [
        "Evicted",
        "NoStatus",
        "RenewalWindow",
        "HoldsData",
        "IdentityNotAPod",
    ] {
        assert!(words.contains(w), "{w} not found in the code: {words:?}");
    }
    // Pod phases are judged by name (`Running`, `Pending`, `Unknown`).
    for w in ["Running", "Pending", "Unknown"] {
        words.insert(w.to_owned());
    }
    // Kind names are not reason words.
    for w in ["ConfigMap", "Lease"] {
        words.remove(w);
    }
    let page = read("docs/how-it-decides.md");
    let missing: Vec<&String> = words
        .iter()
        .filter(|w| !page.contains(&format!("`{w}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "how-it-decides.md does not explain {missing:?}"
    );
}

#[test]
fn the_chart_readme_is_what_helm_docs_generates() {
    let out = std::process::Command::new(root().join("hack/helm-docs.sh"))
        .arg("--check")
        .output()
        .expect("run hack/helm-docs.sh");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every value of values.yaml (a leaf, or a map whose own comment documents
/// it whole, such as nodeSelector) is a row of the chart's README.
#[test]
fn the_chart_readme_lists_every_value() {
    let values: serde_json::Value =
        serde_saphyr::from_str(&read("charts/lock-janitor/values.yaml")).expect("values.yaml");
    let readme = read("charts/lock-janitor/README.md");
    let rows: BTreeSet<&str> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(" |").next())
        .collect();
    fn leaves(v: &serde_json::Value, path: String, out: &mut Vec<String>) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, v) in m {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    leaves(v, p, out);
                }
            }
            _ => out.push(path),
        }
    }
    let mut all = Vec::new();
    leaves(&values, String::new(), &mut all);
    assert!(all.len() > 60, "{all:?}");
    let missing: Vec<&String> = all
        .iter()
        .filter(|leaf| {
            // The leaf itself, or a map above it documented as a whole.
            let parts: Vec<&str> = leaf.split('.').collect();
            !(1..=parts.len()).any(|n| rows.contains(parts[..n].join(".").as_str()))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "values not in charts/lock-janitor/README.md: {missing:?}"
    );
}

/// The metric family names of a text exposition.
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn metrics_listed_are_the_metrics_exported() {
    let page = read("docs/metrics-and-events.md");
    let listed = table_names(&page, "## Metrics", "lock_janitor_");
    assert!(listed.len() >= 15, "{listed:?}");

    // A janitor that has something to say for every per-lock series: a
    // reclaim with the pod deleted, a takeover that times out, and a stale
    // lock kept by a finalizer.
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "docs-metrics").await;
    let leader = running_pod(&client, &ns, "leader", "node-a").await;
    create_lock(&client, &lock_for("op-lock", &leader, true)).await;
    let kept = running_pod(&client, &ns, "kept", "node-a").await;
    let mut cm = lock_for("kept-lock", &kept, true);
    cm.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    create_lock(&client, &cm).await;
    let user = "docs-janitor";
    bind_cluster_role(&client, user, JANITOR_USER).await;
    let j = Janitor::start(
        &kubeconfig_as(cp, user),
        &[
            "-n",
            &ns,
            "--delete-pod",
            "--takeover-timeout",
            "1s",
            "--resync",
            "5s",
            "--auto-opt-in",
        ],
    )
    .await;
    for pod in ["leader", "kept"] {
        kubelet::set_failed(
            &client,
            &ns,
            pod,
            "Evicted",
            "The node was low on resource: memory.",
        )
        .await
        .expect("evict");
    }
    // Per-lock series come and go (an awaited takeover times out): what the
    // janitor exports is the union of its scrapes over the scenario.
    let mut exported = BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !exported.is_superset(&listed) && std::time::Instant::now() < deadline {
        exported.extend(
            families(&j.metrics().await)
                .into_iter()
                .filter(|n| n.starts_with("lock_janitor_")),
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let p = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .patch("kept-lock", &PatchParams::default(), &p)
        .await
        .expect("remove the finalizer");
    assert_eq!(
        exported,
        listed,
        "docs/metrics-and-events.md and /metrics differ: exported but not listed {:?}, listed but not exported {:?}",
        exported.difference(&listed).collect::<Vec<_>>(),
        listed.difference(&exported).collect::<Vec<_>>()
    );
}

/// The modules of `dir` by name: its `.rs` files' stems and its
/// subdirectories (a subdirectory beside a file of its name, such as
/// `memory.rs` and `memory/`, is that module's).
fn modules_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.strip_suffix(".rs").map_or(name.clone(), str::to_owned)
        })
        .collect()
}

/// docs/development.md's layout names every module of src/ and nothing
/// that is not there: each `name.rs` and `name/` of its code block exists
/// in src/, a directory's `(a b c)` lists exactly its modules, and every
/// entry of src/ is named.
#[test]
fn the_layout_in_development_md_is_the_tree() {
    let doc = read("docs/development.md");
    let block = doc
        .split("## Layout")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("a code block under ## Layout in docs/development.md");
    let src = root().join("src");
    let ident = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    let mut named = BTreeSet::new();
    for line in block.lines().filter(|l| !l.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let mut i = 0;
        while i < words.len() {
            let w = words[i];
            if let Some(dir) = w.strip_suffix('/').filter(|d| ident(d)) {
                assert!(
                    src.join(dir).is_dir(),
                    "the layout names {w}, not a directory of src/"
                );
                named.insert(dir.to_owned());
                if words.get(i + 1).is_some_and(|n| n.starts_with('(')) {
                    let mut listed = BTreeSet::new();
                    loop {
                        i += 1;
                        let m = words
                            .get(i)
                            .unwrap_or_else(|| panic!("{w}'s list is not closed"));
                        listed.insert(m.trim_matches(|c| c == '(' || c == ')').to_owned());
                        if m.ends_with(')') {
                            break;
                        }
                    }
                    assert_eq!(listed, modules_in(&src.join(dir)), "the modules of src/{w}");
                }
            } else if let Some(file) = w.strip_suffix(".rs").filter(|f| ident(f)) {
                assert!(
                    src.join(w).is_file(),
                    "the layout names {w}, not a file of src/"
                );
                named.insert(file.to_owned());
            }
            i += 1;
        }
    }
    assert_eq!(
        named,
        modules_in(&src),
        "the entries of src/ and the layout's"
    );
}

/// One description of what lock-janitor frees, wherever it is said: the
/// crate, `lock-janitor --help`, the image's labels (the Dockerfile and the
/// release's image writer) and the chart. Leases are watched by default,
/// so none of them may say ConfigMaps only.
#[test]
fn the_description_names_both_lock_kinds_everywhere() {
    let desc = env!("CARGO_PKG_DESCRIPTION");
    assert!(
        desc.contains("ConfigMaps") && desc.contains("Leases"),
        "Cargo.toml's description names one kind of lock only: {desc}"
    );
    for f in ["Dockerfile", "hack/ociimage/main.go", "src/cli.rs"] {
        assert!(read(f).contains(desc), "{f} does not say {desc:?}");
    }
    let out = std::process::Command::new(janitor_bin())
        .arg("--help")
        .output()
        .expect("lock-janitor --help");
    assert!(out.status.success());
    let help = collapse(&String::from_utf8_lossy(&out.stdout));
    assert!(
        help.contains("ConfigMaps and Leases by default") && !help.contains("Only ConfigMaps"),
        "lock-janitor --help: {help}"
    );
    let chart: serde_json::Value =
        serde_saphyr::from_str(&read("charts/lock-janitor/Chart.yaml")).expect("Chart.yaml");
    let chart_desc = chart["description"].as_str().unwrap_or_default();
    assert!(
        chart_desc.contains("ConfigMaps and Leases"),
        "Chart.yaml: {chart_desc}"
    );
    let readme = read("charts/lock-janitor/README.md");
    assert!(
        readme.contains(chart_desc),
        "the chart README's description"
    );
}

/// values.yaml sizes its requests from the figures docs/performance.md
/// measured at user scale (500 and 1,000 locks, a re-list, the idle CPU of
/// each replica) and its memory limit from those at 10,000 locks, not from
/// the goal.
#[test]
fn the_memory_comment_quotes_the_measured_figures() {
    let perf_flat = collapse(&read("docs/performance.md"));
    let values_flat = collapse(&read("charts/lock-janitor/values.yaml").replace('#', " "));
    for (what, figure) in [
        (
            "500 locks, resident",
            "13.6 MiB VmRSS, 15.1 MiB VmHWM, 16.3 MiB after a re-list at 500",
        ),
        (
            "1,000 locks, idle CPU of each replica",
            "1.93 (0.96 + 0.97)",
        ),
    ] {
        assert!(
            perf_flat.contains(figure),
            "docs/performance.md no longer says {figure:?} ({what})"
        );
    }
    for quoted in ["13.6 MiB", "15.1 MiB", "16.3 MiB", "0.96 %", "0.97 %"] {
        assert!(
            values_flat.contains(quoted),
            "values.yaml's resources comment does not quote the measured {quoted}"
        );
    }
    let perf = read("docs/performance.md");
    let row: Vec<&str> = perf
        .lines()
        .find(|l| l.starts_with("| 10,000 | "))
        .expect("docs/performance.md: the 10,000-lock row of Footprint and speed")
        .split(" | ")
        .collect();
    let values = collapse(&read("charts/lock-janitor/values.yaml").replace('#', " "));
    for (what, cell) in [("VmRSS steady", row[1]), ("VmHWM", row[2])] {
        assert!(
            values.contains(cell),
            "values.yaml's memory comment does not quote the measured {what} ({cell})"
        );
    }
    let after_relist = row[3].split(" (").next().unwrap();
    assert!(
        values.contains(after_relist),
        "peak after a re-list {after_relist}"
    );
    assert!(
        !values.contains("2.3 KiB"),
        "2.3 KiB per lock is the goal, not a measure"
    );
}

/// What the chart README says of the chart is what the chart does: the
/// delete guard admits a Lease DELETE (held for life), `{}` is refused as
/// an auto opt-in namespaceSelector, and no values row is cut by a comment
/// line that helm-docs reads as the start of another description (a line
/// starting `# --` followed by anything but a space, as a wrapped
/// `--runtime-config` once was).
#[test]
fn the_chart_readme_says_what_the_chart_does() {
    let text = collapse(&read("charts/lock-janitor/README.md"));
    assert!(
        !text.contains("and no Lease"),
        "the guard admits the DELETE of a Lease held for life"
    );
    assert!(
        text.contains("on by default") && text.contains("autoOptIn.excludeNamespaces"),
        "the chart README says that auto opt-in is on and what it leaves out"
    );
    for (n, line) in read("charts/lock-janitor/values.yaml").lines().enumerate() {
        let t = line.trim_start();
        assert!(
            !t.starts_with("# --") || t.starts_with("# -- "),
            "values.yaml:{}: helm-docs reads this comment line as a new description: {t}",
            n + 1
        );
    }
}

/// install.md's install from the checkout, as written there: the command,
/// with `<REGISTRY>` and `<version>` filled in and `helm install` run as
/// `helm template`, runs the image `make push` pushes
/// (`<REGISTRY>/lock-janitor:<version>`, hack/push.sh). `make release-check`
/// runs the registry path (`hack/push.sh`, then the command it prints); this
/// keeps the from-checkout alternative in step with it.
#[test]
fn install_from_the_checkout_runs_the_pushed_image() {
    let text = read("docs/install.md");
    let intro = "To install the chart from the checkout instead: `";
    let start = text
        .find(intro)
        .expect("install.md's from-checkout command")
        + intro.len();
    let command: Vec<&str> = text[start..]
        .split('`')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        command[..4],
        ["helm", "install", "lock-janitor", "./charts/lock-janitor"],
        "{command:?}"
    );
    assert!(
        text.contains("to `<REGISTRY>/lock-janitor:<version>`")
            && read("hack/push.sh").contains(r#"repo="$registry/lock-janitor""#),
        "install.md and hack/push.sh no longer agree on where the image goes"
    );
    let registry = "registry.example.com/platform";
    let version = env!("CARGO_PKG_VERSION");
    let args: Vec<String> = command[2..]
        .iter()
        .map(|a| {
            a.replace("<REGISTRY>", registry)
                .replace("<version>", version)
        })
        .collect();
    let out = std::process::Command::new(crate::support::chart::helm())
        .current_dir(root())
        .arg("template")
        .args(&args)
        .output()
        .expect("running helm");
    assert!(
        out.status.success(),
        "helm template {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8(out.stdout).unwrap();
    let images: BTreeSet<&str> = rendered
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .collect();
    let want = format!("\"{registry}/lock-janitor:{version}\"");
    assert!(
        images.contains(want.as_str()),
        "install.md's from-checkout command runs {images:?}, not the pushed {want}"
    );
}

/// The README's promise names its one exception with the binary's own
/// default, and its Verify step works as pasted: `kubectl logs -l` with
/// `--tail=-1` (else 10 lines per pod), and the metrics read from the
/// leader's pod, not a Service that picks a replica at random.
#[test]
fn the_readme_says_its_exception_and_its_verify_step_works_as_pasted() {
    use clap::Parser;
    let readme = read("README.md");
    let flat = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let run = match lock_janitor::cli::Cli::try_parse_from(["lock-janitor", "run"])
        .expect("run with its defaults")
        .command
    {
        lock_janitor::cli::Command::Run(r) => r,
        other => panic!("not run: {other:?}"),
    };
    let grace = format!(
        "`--owner-gone-grace` ({} s)",
        run.owner_gone_grace.as_secs()
    );
    assert!(
        flat.contains("It never frees a lock whose holder pod might still run, as far as the API server shows it.")
            && flat.contains(&grace),
        "the README's safety promise must name the owner-gone exception with {grace}"
    );
    // And the Lease's: an identity, not a pod (how-it-decides.md's shared
    // identity), in both places.
    let decides = read("docs/how-it-decides.md")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        flat.contains(
            "it cannot tell a dead pod from another process that renews under the same identity"
        ) && decides.contains("an identity shared by a dead pod and a live process elsewhere"),
        "the README's promise and how-it-decides.md's shared-identity case must agree"
    );
    for line in readme
        .lines()
        .filter(|l| l.trim_start().starts_with("kubectl "))
    {
        if line.contains("kubectl logs") && line.contains(" -l ") {
            assert!(
                line.contains("--tail=-1"),
                "kubectl logs -l shows 10 lines per pod: {line}"
            );
        }
        if line.contains("port-forward") {
            assert!(
                !line.contains("svc/"),
                "a port-forward to the Service reaches a random replica: {line}"
            );
        }
    }
}

/// The README's `kubectl` + `jq` one-liner, run as written (bash, the
/// testenv's kubectl, the machine's jq: hack/setup.sh installs it) against
/// the shared control plane: it lists exactly the lock candidates of a
/// namespace set up with one of each shape, and none of the look-alikes.
#[tokio::test]
async fn the_readmes_kubectl_and_jq_one_liner_lists_the_candidates() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::api::PostParams;
    let readme = read("README.md");
    let marker = "# lock candidates, with kubectl and jq only";
    let start = readme.find(marker).expect("the README's one-liner");
    let script =
        &readme[start..start + readme[start..].find("\n```").expect("its code block's end")];
    let jq = std::process::Command::new("jq").arg("--version").output();
    assert!(
        jq.is_ok_and(|o| o.status.success()),
        "jq is not installed: run hack/setup.sh"
    );

    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    let ns = fresh_namespace(&client, "oneliner").await;
    let node = format!("node-{ns}");
    let pod = |name: &'static str| {
        let (client, ns, node) = (client.clone(), ns.clone(), node.clone());
        async move {
            kubelet::create_pod(&client, &ns, name, &node, &[])
                .await
                .expect("pod")
        }
    };
    let (leader, other) = (pod("op-1").await, pod("op-2").await);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    let cm = |name: &str, owners: Vec<&k8s_openapi::api::core::v1::Pod>, data: bool| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: Some(owners.into_iter().map(pod_owner).collect()),
            ..Default::default()
        },
        data: data.then(|| [("k".to_string(), "v".to_string())].into()),
        ..Default::default()
    };
    cms.create(&pp, &lock_for("memcached-operator-lock", &leader, true))
        .await
        .unwrap();
    cms.create(&pp, &cm("unlabeled-lock", vec![&other], false))
        .await
        .unwrap();
    cms.create(&pp, &cm("holds-data", vec![&leader], true))
        .await
        .unwrap();
    cms.create(&pp, &cm("two-owners", vec![&leader, &other], false))
        .await
        .unwrap();
    cms.create(&pp, &cm("no-owner", vec![], false))
        .await
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let lease = |name: &str, holder: &str| Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }),
    };
    for (name, holder) in [
        ("by-pod-name", "op-1"),
        (
            "controller-runtime",
            "op-2_5f7c2a9e-1b2c-4d5e-8f90-123456789abc",
        ),
        ("names-no-pod", "ghost"),
        ("released", ""),
    ] {
        leases.create(&pp, &lease(name, holder)).await.unwrap();
    }

    let kubectl = lock_janitor_testenv::binary("kubectl").unwrap_or_else(|e| panic!("{e}"));
    let path = format!(
        "{}:{}",
        kubectl.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .env("PATH", path)
        .env("KUBECONFIG", cp.kubeconfig_path())
        .output()
        .await
        .expect("running bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mine: BTreeSet<&str> = stdout
        .lines()
        .filter(|l| l.contains(&format!(" {ns}/")))
        .collect();
    let want: BTreeSet<String> = [
        format!("configmap {ns}/memcached-operator-lock holder=op-1 watch=true"),
        format!("configmap {ns}/unlabeled-lock holder=op-2 watch=-"),
        format!("lease {ns}/by-pod-name holder=op-1 watch=-"),
        format!("lease {ns}/controller-runtime holder=op-2_5f7c2a9e-1b2c-4d5e-8f90-123456789abc watch=-"),
    ]
    .into();
    assert_eq!(mine, want.iter().map(String::as_str).collect(), "{stdout}");
}
