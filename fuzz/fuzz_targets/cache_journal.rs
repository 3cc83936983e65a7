//! A cache journal's bytes (records of present runs, possibly torn or forged): opened like a
//! journal on disk, then asked which parts of ranges are missing. Gaps are inside the range,
//! in order, apart, and disjoint from every recorded run.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_remote::{decode_records, Journal};

fuzz_target!(|data: &[u8]| {
    let (runs, valid) = decode_records(data);
    assert!(valid <= data.len());
    let path = std::env::temp_dir().join(format!("strata-fuzz-journal-{}", std::process::id()));
    std::fs::write(&path, data).unwrap();
    let journal = Journal::open(&path).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len() as usize,
        valid,
        "torn tail kept"
    );
    let mut queries: Vec<(u64, u64)> = runs
        .iter()
        .map(|r| (r.offset.saturating_sub(3), r.len + 7))
        .collect();
    queries.extend([(0, 1 << 20), (0, u64::MAX), (u64::MAX - 5, 100)]);
    for (offset, len) in queries {
        let end = offset.saturating_add(len);
        let gaps = journal.missing(offset, len);
        let mut at = offset;
        for &(s, n) in &gaps {
            assert!(n > 0 && s >= at && s + n <= end, "gap {s}+{n} of {offset}+{len}");
            for r in journal.runs() {
                assert!(
                    s + n <= r.offset || s >= r.offset + r.len,
                    "gap {s}+{n} overlaps run {r:?}"
                );
            }
            at = s + n;
        }
    }
    let _ = journal.covered_bytes();
    let _ = std::fs::remove_file(&path);
});
