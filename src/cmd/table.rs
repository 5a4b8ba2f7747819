//! Text tables and the small formats in them (kubectl-style ages, names
//! shortened with an ellipsis, wrapped notes), and the `scan` and `label`
//! tables.

use std::fmt::Write as _;

use super::label_report::{LabelResult, LabelRow};
use super::report::{Report, Row};
use super::scope_text;
use crate::cli::Scope;

/// kubectl-style age: 45s, 3m20s, 42m, 5h30m, 20h, 3d4h, 30d, 2y40d.
pub fn human_age(secs: u64) -> String {
    let (m, h, d) = (60, 3600, 86400);
    let y = 365 * d;
    // In `unit`s, and the rest in `small`s unless none.
    let two = |unit: u64, u: &str, small: u64, sm: &str| match (secs % unit) / small {
        0 => format!("{}{u}", secs / unit),
        r => format!("{}{u}{r}{sm}", secs / unit),
    };
    match secs {
        s if s < 2 * m => format!("{s}s"),
        s if s < 10 * m => two(m, "m", 1, "s"),
        s if s < 3 * h => format!("{}m", s / m),
        s if s < 8 * h => two(h, "h", m, "m"),
        s if s < 2 * d => format!("{}h", s / h),
        s if s < 8 * d => two(d, "d", h, "h"),
        s if s < 2 * y => format!("{}d", s / d),
        s if s < 8 * y => two(y, "y", d, "d"),
        s => format!("{}y", s / y),
    }
}

/// Shortens `s` to `width` characters with a `…` in the middle, which keeps
/// both a name's prefix and the generated suffix of pod names.
pub fn ellipsize(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_owned();
    }
    if width == 0 {
        return String::new();
    }
    let keep = width - 1;
    let tail = keep / 2;
    let head = keep - tail;
    let mut out: String = s.chars().take(head).collect();
    out.push('…');
    out.extend(s.chars().skip(n - tail));
    out
}

/// A node name without its domain (`ip-10-0-1-2.ec2.internal` → `ip-10-0-1-2`),
/// as long as what is left is not a number (an IP address stays whole).
pub fn short_host(node: &str) -> String {
    match node.split_once('.') {
        Some((host, _)) if host.bytes().any(|b| b.is_ascii_alphabetic()) => host.to_owned(),
        _ => node.to_owned(),
    }
}

/// Cuts `s` to `width` characters, ending with `…`.
fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Wraps `text` at spaces into lines of at most `width` characters (a word
/// longer than that gets a line of its own), continuation lines indented.
pub fn wrap(text: &str, width: usize, indent: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let len = line.chars().count();
        if !line.trim().is_empty() && len + 1 + word.chars().count() > width {
            out.push_str(line.trim_end());
            out.push('\n');
            line = " ".repeat(indent);
        }
        if !line.trim().is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// Aligned columns, two spaces apart, fitted into `max` characters by
/// shortening the shrinkable columns (widest first, stage by stage). Cells
/// are cut at their end, those of the `middle` columns in the middle.
pub fn render_table(
    headers: &[&str],
    rows: &[Vec<String>],
    max: usize,
    stages: &[&[(usize, usize)]],
    middle: &[usize],
) -> String {
    let cols = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let total = |w: &[usize]| w.iter().sum::<usize>() + 2 * (cols.saturating_sub(1));
    for stage in stages {
        while total(&widths) > max {
            let Some(&(i, _)) = stage
                .iter()
                .filter(|(i, min)| widths[*i] > *min)
                .max_by_key(|(i, _)| widths[*i])
            else {
                break;
            };
            widths[i] -= 1;
        }
    }
    let mut out = String::new();
    let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_row).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            let cell = if middle.contains(&i) {
                ellipsize(cell, widths[i])
            } else {
                cut(cell, widths[i])
            };
            line.push_str(&cell);
            if i + 1 < cols {
                let pad = widths[i] - cell.chars().count();
                line.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

// The `scan` table.

/// Width the notes and summaries on stderr are wrapped at, and the table
/// fits in on a terminal whose width is not known.
pub const TABLE_WIDTH: usize = 100;

/// How a table is printed.
#[derive(Clone, Copy, Debug)]
pub struct Style {
    /// `-o wide`: more columns, never cut.
    pub wide: bool,
    /// Without `--no-headers`.
    pub headers: bool,
    /// The width to fit in; `None` (stdout is not a terminal, or wide):
    /// nothing is cut.
    pub width: Option<usize>,
}

impl Style {
    /// For `-o table|wide` on this process's stdout: cut to fit only on a
    /// terminal (its width from $COLUMNS, else 100).
    pub fn for_stdout(wide: bool, no_headers: bool) -> Style {
        use std::io::IsTerminal;
        let width = (!wide && std::io::stdout().is_terminal()).then(|| {
            std::env::var("COLUMNS")
                .ok()
                .and_then(|c| c.parse().ok())
                .filter(|&c: &usize| c >= 40)
                .unwrap_or(TABLE_WIDTH)
        });
        Style {
            wide,
            headers: !no_headers,
            width,
        }
    }

    /// `rows` under `headers` (unless `--no-headers`), fitted to the width
    /// if there is one (see [`render_table`]).
    pub fn render(
        self,
        headers: &[&str],
        rows: &[Vec<String>],
        stages: &[&[(usize, usize)]],
        middle: &[usize],
    ) -> String {
        let width = self.width.unwrap_or(usize::MAX);
        let table = render_table(headers, rows, width, stages, middle);
        match table.split_once('\n') {
            Some((_, rows)) if !self.headers => rows.to_owned(),
            _ => table,
        }
    }
}

/// A note on one lock under a table, on stderr: `<ns>/<name>: <message>`.
fn note(err: &mut String, namespace: &str, name: &str, message: &str) {
    err.push_str(&wrap(
        &format!("{namespace}/{name}: {message}"),
        TABLE_WIDTH,
        4,
    ));
}

/// What a table command prints: the table on stdout, notes, summaries
/// and hints on stderr.
#[derive(Debug, Default)]
pub struct Rendered {
    pub stdout: String,
    pub stderr: String,
}

const HEADERS: [&str; 8] = [
    "NAMESPACE",
    "NAME",
    "LABELED",
    "HOLDER",
    "PHASE",
    "NODE",
    "AGE",
    "VERDICT",
];
/// `-o wide` adds these.
const WIDE_HEADERS: [&str; 3] = ["HOLDER-UID", "DIED", "MESSAGE"];
/// Columns that may be shortened (index, narrowest width), in stages: first
/// the holder (pod names end in a generated suffix), node and namespace, then
/// the lock name and phase, the verdict only as a last resort.
const SHRINKABLE: [&[(usize, usize)]; 3] = [
    &[(3, 20), (5, 12), (0, 14)],
    &[(0, 9), (1, 20), (3, 10), (4, 14), (5, 6)],
    &[(1, 12), (4, 8), (7, 20)],
];

/// Columns shortened in the middle: pod and node names end in a generated,
/// identifying suffix. The others keep their beginning.
const MIDDLE: [usize; 2] = [3, 5];

/// Says what was left out for holding data, if anything.
pub fn skipped_line(out: &mut String, skipped_with_data: usize) {
    if skipped_with_data > 0 {
        out.push_str(&wrap(
            &format!(
                "{skipped_with_data} unlabeled ConfigMap{} owned by one Pod skipped: {} data, and a \
                 leader-for-life lock is empty.",
                if skipped_with_data == 1 { "" } else { "s" },
                if skipped_with_data == 1 { "it holds" } else { "they hold" },
            ),
            TABLE_WIDTH,
            0,
        ));
    }
}

/// The NAME cell: a Lease lock says so; a ConfigMap lock is the default.
fn name_cell(kind: &str, name: &str) -> String {
    match kind {
        "lease" => format!("lease/{name}"),
        _ => name.to_owned(),
    }
}

/// The cells of one row of the `scan` table.
fn cells(r: &Row, wide: bool) -> Vec<String> {
    let dash = || "-".to_owned();
    let mut cells = vec![
        r.namespace.clone(),
        name_cell(&r.kind, &r.name),
        if r.labeled { "yes" } else { "no" }.into(),
        r.holder.clone().unwrap_or_else(dash),
        r.phase_cell(),
        match (&r.node, wide) {
            (Some(n), true) => n.clone(),
            (Some(n), false) => short_host(n),
            (None, _) => dash(),
        },
        r.age_seconds.map(human_age).unwrap_or_else(dash),
        r.verdict.clone(),
    ];
    if wide {
        cells.push(r.holder_uid.clone().unwrap_or_else(dash));
        cells.push(r.died_at.clone().unwrap_or_else(dash));
        cells.push(r.message.clone());
    }
    cells
}

/// `-o table|wide`: the table on stdout; the notes on locks that are not
/// simply held, the summary and the hints on stderr.
pub fn render_report(report: &Report, scope: &Scope, style: Style) -> Rendered {
    let s = &report.summary;
    let mut out = Rendered::default();
    let err = &mut out.stderr;
    if report.locks.is_empty() {
        let _ = writeln!(
            err,
            "No lock candidates in {} ({} ConfigMaps scanned).",
            scope_text(scope),
            s.configmaps_scanned
        );
        skipped_line(err, s.skipped_with_data);
        return out;
    }
    let rows: Vec<Vec<String>> = report.locks.iter().map(|r| cells(r, style.wide)).collect();
    let mut headers = HEADERS.to_vec();
    if style.wide {
        headers.extend(WIDE_HEADERS);
    }
    out.stdout = style.render(&headers, &rows, &SHRINKABLE, &MIDDLE);

    // Explain what a glance at the table does not (wide has a MESSAGE column).
    let notes: Vec<&Row> = report
        .locks
        .iter()
        .filter(|_| !style.wide)
        .filter(|r| r.state != "held" || r.reason.as_deref() == Some("OwnerGoneGrace"))
        .collect();
    for r in &notes {
        note(err, &r.namespace, &r.name, &r.message);
    }
    if !notes.is_empty() {
        err.push('\n');
    }
    let mut parts = vec![format!("{} held", s.held), format!("{} stale", s.stale)];
    if s.ambiguous > 0 {
        parts.push(format!("{} ambiguous", s.ambiguous));
    }
    if s.unmanageable > 0 {
        parts.push(format!("{} unmanageable", s.unmanageable));
    }
    let summary = format!(
        "{} lock{} ({} labeled, {} unlabeled) in {}: {}.",
        s.total,
        if s.total == 1 { "" } else { "s" },
        s.labeled,
        s.unlabeled,
        scope_text(scope),
        parts.join(", "),
    );
    err.push_str(&wrap(&summary, TABLE_WIDTH, 0));
    let _ = writeln!(
        err,
        "{} ConfigMaps scanned in {:.2}s.",
        s.configmaps_scanned, s.duration_seconds
    );
    skipped_line(err, s.skipped_with_data);
    if s.unlabeled > 0 {
        err.push_str(&wrap(
            "Unlabeled locks are not watched by `lock-janitor run`; opt them in with \
             `lock-janitor label` (add --apply to write).",
            TABLE_WIDTH,
            0,
        ));
    }
    out
}

// The `label` table.

const LABEL_HEADERS: [&str; 4] = ["NAMESPACE", "NAME", "HOLDER", "RESULT"];
/// `label -o wide` adds these.
const LABEL_WIDE_HEADERS: [&str; 2] = ["HOLDER-UID", "MESSAGE"];
/// As in the `scan` table: the holder and namespace first, the result never.
const LABEL_SHRINKABLE: [&[(usize, usize)]; 2] = [&[(2, 20), (0, 14)], &[(0, 9), (1, 20), (2, 10)]];

/// `label -o table|wide`: the table on stdout; a note on each lock not
/// labeled as asked (skipped, gone, conflict, failed) on stderr (the
/// summary is the caller's).
pub fn render_label(rows: &[LabelRow], style: Style) -> Rendered {
    let dash = || "-".to_owned();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                r.namespace.clone(),
                name_cell(r.kind, &r.name),
                r.holder.clone().unwrap_or_else(dash),
                r.result.as_str().to_owned(),
            ];
            if style.wide {
                c.push(r.holder_uid.clone().unwrap_or_else(dash));
                c.push(r.message.clone());
            }
            c
        })
        .collect();
    let mut headers = LABEL_HEADERS.to_vec();
    if style.wide {
        headers.extend(LABEL_WIDE_HEADERS);
    }
    let mut out = Rendered::default();
    if !rows.is_empty() {
        out.stdout = style.render(&headers, &cells, &LABEL_SHRINKABLE, &[2]);
    }
    let noted = |r: &&LabelRow| {
        !style.wide
            && !matches!(
                r.result,
                LabelResult::WouldLabel | LabelResult::Labeled | LabelResult::Unchanged
            )
    };
    for r in rows.iter().filter(noted) {
        note(&mut out.stderr, &r.namespace, &r.name, &r.message);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        for (s, want) in [
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (200, "3m20s"),
            (42 * 60 + 5, "42m"),
            (5 * 3600 + 30 * 60, "5h30m"),
            (20 * 3600, "20h"),
            (3 * 86400 + 4 * 3600, "3d4h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400, "3y"),
        ] {
            assert_eq!(human_age(s), want, "{s}");
        }
    }

    #[test]
    fn wraps_at_spaces() {
        let text = "a ".repeat(80) + &"b".repeat(120);
        let w = wrap(&text, 100, 4);
        let lines: Vec<&str> = w.lines().collect();
        assert_eq!(lines.len(), 3, "{w}");
        assert!(lines[0].len() <= 100 && lines[1].starts_with("    a"));
        assert_eq!(lines[2], format!("    {}", "b".repeat(120)));
        assert_eq!(wrap("short", 100, 4), "short\n");
    }

    #[test]
    fn node_names_lose_their_domain() {
        assert_eq!(
            short_host("ip-10-0-12-34.eu-west-1.compute.internal"),
            "ip-10-0-12-34"
        );
        assert_eq!(short_host("node-a"), "node-a");
        assert_eq!(short_host("10.0.12.34"), "10.0.12.34");
    }

    #[test]
    fn ellipsis_keeps_both_ends() {
        assert_eq!(ellipsize("short", 10), "short");
        assert_eq!(
            ellipsize("memcached-operator-7d9f8b6c5-x2x9k", 15),
            "memcach…5-x2x9k"
        );
        assert_eq!(
            ellipsize("memcached-operator-7d9f8b6c5-x2x9k", 15)
                .chars()
                .count(),
            15
        );
        assert_eq!(ellipsize("abc", 1), "…");
    }
    #[test]
    fn table_fits_in_100_columns_and_aligns() {
        let long = "x".repeat(80);
        let rows = vec![
            vec![
                "operators-production-eu-west".to_string(),
                format!("memcached-operator-lock-{long}"),
                "no".into(),
                format!("memcached-operator-{long}-7d9f8b6c5-x2x9k"),
                "Failed/Evicted".into(),
                "ip-10-0-12-34.eu-west-1.compute.internal".into(),
                "3d4h".into(),
                "unmanageable:OwnerInOtherNamespace".into(),
            ],
            vec![
                "ops".into(),
                "lock".into(),
                "yes".into(),
                "op-1".into(),
                "Running".into(),
                "node-a".into(),
                "5s".into(),
                "held".into(),
            ],
        ];
        let t = render_table(&HEADERS, &rows, 100, &SHRINKABLE, &MIDDLE);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        for l in &lines {
            assert!(l.chars().count() <= 100, "{} chars: {l}", l.chars().count());
        }
        // Every column starts at the same offset on every line.
        let col = |l: &str, word: &str| l.find(word).unwrap();
        let verdict_at = lines[0].chars().count() - "VERDICT".len();
        assert_eq!(lines[2].chars().count(), verdict_at + "held".len());
        assert_eq!(col(lines[0], "LABELED"), col(lines[2], "yes"));
        assert!(lines[1].contains("unmanageable:Owner"), "{t}");
        assert!(lines[1].contains('…'));

        // Without a width (stdout not a terminal, or -o wide) nothing is cut.
        let t = render_table(&HEADERS, &rows, usize::MAX, &SHRINKABLE, &MIDDLE);
        assert!(t.contains(&rows[0][1]) && t.contains(&rows[0][3]), "{t}");
        assert!(!t.contains('…'), "{t}");

        // Short tables are not padded out to 100.
        let t = render_table(&HEADERS, &rows[1..], 100, &SHRINKABLE, &MIDDLE);
        assert!(t.lines().all(|l| l.len() < 70), "{t}");
    }

    #[test]
    fn label_table_fits_a_terminal_and_keeps_the_result() {
        let row = |name: &str, result| LabelRow {
            kind: "configmap",
            namespace: "operators-production".into(),
            name: name.into(),
            created_at: None,
            labeled: false,
            holder: Some("memcached-operator-7d9f8b6c5-x2x9k".into()),
            holder_uid: None,
            result,
            current_value: Some("false".into()),
            message: "has lock-janitor.io/watch=false; not overwriting it".into(),
        };
        let rows = [
            row("memcached-operator-lock", LabelResult::WouldLabel),
            row("legacy-lock", LabelResult::Skipped),
        ];
        let style = |width, headers| Style {
            wide: false,
            headers,
            width,
        };
        let out = render_label(&rows, style(Some(60), true));
        for l in out.stdout.lines() {
            assert!(l.chars().count() <= 60, "{l}");
        }
        assert!(out.stdout.contains("would-label") && out.stdout.contains('…'));
        assert!(
            out.stdout.contains("…x2x9k"),
            "pod names keep their suffix\n{}",
            out.stdout
        );
        // The skipped lock is explained on stderr, the other not.
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
        assert!(out
            .stderr
            .starts_with("operators-production/legacy-lock: has"));
        // Piped: nothing cut; --no-headers drops the header alone.
        let piped = render_label(&rows, style(None, false));
        assert!(!piped.stdout.contains('…'));
        assert_eq!(piped.stdout.lines().count(), 2);
        assert!(piped
            .stdout
            .starts_with("operators-production  memcached-operator-lock"));
    }
}
