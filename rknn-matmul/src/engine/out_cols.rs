//! A lane's columns of the caller's output, lent to it for one round.
//!
//! Each lane of a forward writes its block of columns straight into the caller's output
//! instead of into a buffer of its own that the caller then copied (one more pass over every
//! output value, reading lines another core had just written). The lanes' column ranges are
//! disjoint, so they never write the same element; only the caller's round makes the views,
//! and it waits for every lane before it returns or unwinds
//! ([`super::scheduler::Round::run_all`]).

/// Columns `n0..n0 + width` of rows `0..rows` of a row-major output with `ld` values per row,
/// writable row by row. It holds no lifetime, because the task that carries it to a worker
/// must be `'static`: the round that makes it keeps the output borrowed until every lane has
/// dropped its view (see [`OutCols::split`]).
pub(crate) struct OutCols {
    /// The first value of row 0 of these columns.
    ptr: *mut f32,
    rows: usize,
    ld: usize,
    width: usize,
}

// SAFETY: an `OutCols` is the only way to reach its elements while it lives (the contract of
// `split`), so moving it to another thread moves exclusive access to them, as moving a
// `&mut [f32]` would.
unsafe impl Send for OutCols {}

impl OutCols {
    /// Splits `out` (`rows` rows of `ld` values) into the column ranges `(n0, width)` of
    /// `cols`, which must be disjoint and inside a row (checked: a panic otherwise).
    ///
    /// # Safety
    ///
    /// Until every view returned is dropped, `out` must stay allocated and must not be read or
    /// written except through the views.
    pub(crate) unsafe fn split<const L: usize>(
        out: &mut [f32],
        rows: usize,
        ld: usize,
        cols: [Option<(usize, usize)>; L],
    ) -> [Option<OutCols>; L] {
        assert!(
            rows.checked_mul(ld).is_some_and(|n| n <= out.len()),
            "{rows} rows of {ld} values in an output of {}",
            out.len()
        );
        // Sorted in place (no allocation: this runs on every forward).
        let mut spans = [(usize::MAX, 0); L];
        let mut count = 0;
        for &(n0, width) in cols.iter().flatten() {
            spans[count] = (n0, width);
            count += 1;
        }
        let spans = &mut spans[..count];
        spans.sort_unstable();
        for (i, &(n0, width)) in spans.iter().enumerate() {
            let end = n0.checked_add(width).expect("column range overflows usize");
            assert!(end <= ld, "columns {n0}..{end} outside rows of {ld}");
            if let Some(&(next, _)) = spans.get(i + 1) {
                assert!(end <= next, "overlapping column ranges at {next}");
            }
        }
        let base = out.as_mut_ptr();
        cols.map(|c| {
            c.map(|(n0, width)| OutCols {
                // Only dereferenced for rows that exist (`row`), where it is inside `out`.
                ptr: base.wrapping_add(n0),
                rows,
                ld,
                width,
            })
        })
    }

    /// Rows.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Runs `f` on columns `c0..c0 + width` of this view (a lane's block of its columns).
    ///
    /// # Panics
    /// If the columns are not inside the view.
    pub(crate) fn with_columns<R>(
        &mut self,
        c0: usize,
        width: usize,
        f: impl FnOnce(&mut OutCols) -> R,
    ) -> R {
        assert!(
            c0.checked_add(width).is_some_and(|end| end <= self.width),
            "columns {c0}..+{width} of a view of {}",
            self.width
        );
        let mut sub = OutCols {
            // Inside the view's row 0 (checked above); rows as the view's.
            ptr: self.ptr.wrapping_add(c0),
            rows: self.rows,
            ld: self.ld,
            width,
        };
        // `sub` covers a part of this view's elements and lives only during `f`, while this
        // view is borrowed mutably: the two are never used at once.
        f(&mut sub)
    }

    /// The columns of row `r`.
    ///
    /// # Panics
    /// If `r >= rows`.
    pub(crate) fn row(&mut self, r: usize) -> &mut [f32] {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        // SAFETY: `r * ld + n0 + width <= rows * ld <= out.len()` (checked in `split`), so the
        // row's columns lie inside `out`; no other view covers them (the ranges are disjoint),
        // and `&mut self` keeps two rows of this view from being held at once.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r * self.ld), self.width) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_write_their_own_columns_only_from_other_threads() {
        let (rows, ld) = (3, 10);
        let mut out = vec![0.0f32; rows * ld];
        // SAFETY: `out` is used again only after the scope has joined every thread, which
        // dropped the views.
        let views =
            unsafe { OutCols::split(&mut out, rows, ld, [Some((0, 4)), None, Some((4, 6))]) };
        std::thread::scope(|s| {
            for (lane, v) in views.into_iter().enumerate() {
                let Some(mut v) = v else { continue };
                s.spawn(move || {
                    for r in 0..v.rows() {
                        for (j, x) in v.row(r).iter_mut().enumerate() {
                            *x = (100 * lane + 10 * r + j) as f32;
                        }
                    }
                });
            }
        });
        for r in 0..rows {
            for c in 0..ld {
                let want = if c < 4 {
                    10 * r + c
                } else {
                    200 + 10 * r + c - 4
                };
                assert_eq!(out[r * ld + c], want as f32, "row {r} col {c}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "overlapping column ranges")]
    fn overlapping_ranges_are_refused() {
        let mut out = vec![0.0f32; 20];
        // SAFETY: it panics before any view exists.
        let _ = unsafe { OutCols::split(&mut out, 2, 10, [Some((0, 5)), Some((4, 3))]) };
    }

    #[test]
    #[should_panic(expected = "outside rows")]
    fn a_range_past_the_row_is_refused() {
        let mut out = vec![0.0f32; 20];
        // SAFETY: it panics before any view exists.
        let _ = unsafe { OutCols::split(&mut out, 2, 10, [Some((8, 3))]) };
    }

    #[test]
    #[should_panic(expected = "rows of 10 values")]
    fn more_rows_than_the_output_holds_are_refused() {
        let mut out = vec![0.0f32; 20];
        // SAFETY: it panics before any view exists.
        let _ = unsafe { OutCols::split(&mut out, 3, 10, [Some((0, 10))]) };
    }
}
