//! Plain aligned text, as `kubectl get` prints it: no colour, no box
//! drawing, so the output pastes into a ticket and `awk`/`cut` still work.

use std::fmt::Write as _;

/// Left-aligned columns two spaces apart; the last column is not padded,
/// and no line ends in spaces.
pub fn columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                let _ = write!(line, "{cell}{:pad$}  ", "");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `Key:  value` lines, the values aligned, for one object's details.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.chars().count() + 1).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in pairs {
        let key = format!("{k}:");
        let _ = writeln!(out, "{}", format!("{key:<width$}  {v}").trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_lines_do_not_end_in_spaces() {
        let rows = vec![
            vec!["web-80".to_string(), "round_robin".into(), "2".into()],
            vec!["a".to_string(), "ewma".into(), "".into()],
            vec!["ünïcode".to_string(), "x".into(), "10".into()],
        ];
        assert_eq!(
            columns(&["NAME", "ALGORITHM", "ENDPOINTS"], &rows),
            "NAME     ALGORITHM    ENDPOINTS\n\
             web-80   round_robin  2\n\
             a        ewma\n\
             ünïcode  x            10\n"
        );
        assert_eq!(columns(&["A", "B"], &[]), "A  B\n");
    }

    #[test]
    fn fields_align_values() {
        assert_eq!(
            fields(&[
                ("Name", "web".into()),
                ("Algorithm", "ewma".into()),
                ("Empty", "".into())
            ]),
            "Name:       web\nAlgorithm:  ewma\nEmpty:\n"
        );
    }
}
