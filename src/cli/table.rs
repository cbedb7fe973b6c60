//! The CLI's output: indented JSON for `--json`, aligned tables for
//! people, and the wrapping that keeps a long message whole in a cell.

use serde::Serialize;

use super::CliError;

/// Prints `value` as indented JSON (`--json`).
pub(super) fn print_json<T: Serialize>(value: &T) -> Result<(), CliError> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Prints rows as an aligned table with a header.
pub(super) fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            let widest = cell.lines().map(|l| l.chars().count()).max().unwrap_or(0);
            *w = (*w).max(widest);
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        // A cell of several lines (a wrapped message) takes as many
        // lines of the table; the other cells leave them blank.
        let cells: Vec<Vec<&str>> = row.iter().map(|c| c.lines().collect()).collect();
        let height = cells.iter().map(Vec::len).max().unwrap_or(0).max(1);
        for i in 0..height {
            line(
                cells
                    .iter()
                    .map(|c| c.get(i).copied().unwrap_or(""))
                    .collect(),
            );
        }
    }
}

/// `text` on lines of at most `width` characters, broken between words
/// (a longer word alone is cut into pieces): a table shows an error's
/// whole cause, not its first words.
pub(super) fn wrap(text: &str, width: usize) -> String {
    let mut lines: Vec<String> = Vec::new();
    let mut current = String::new();
    for word in text.split_whitespace() {
        let chars: Vec<char> = word.chars().collect();
        for piece in chars.chunks(width.max(1)) {
            let piece: String = piece.iter().collect();
            let len = current.chars().count();
            if len > 0 && len + 1 + piece.chars().count() > width {
                lines.push(std::mem::take(&mut current));
            }
            if !current.is_empty() {
                current.push(' ');
            }
            current.push_str(&piece);
        }
    }
    if !current.is_empty() {
        lines.push(current);
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_keeps_every_word_on_lines_of_the_width() {
        let cause = "error sending request for url (http://127.0.0.1:9/hook): client error (Connect): tcp connect error: Connection refused (os error 111)";
        let wrapped = wrap(cause, 60);
        assert!(
            wrapped.lines().all(|l| l.chars().count() <= 60),
            "{wrapped}"
        );
        assert_eq!(
            wrapped.split_whitespace().collect::<Vec<_>>(),
            cause.split_whitespace().collect::<Vec<_>>()
        );
        assert!(wrapped.contains("(os error 111)"), "{wrapped}");
        assert_eq!(wrap(&"x".repeat(130), 60).lines().count(), 3);
        assert_eq!(wrap("", 60), "");
    }
}
