use super::*;
use crate::gguf_write::GgufWriter;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-gguf-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn sample() -> GgufWriter {
    let mut w = GgufWriter::default();
    w.kv("general.architecture", Value::String("qwen3moe".into()))
        .kv("qwen3moe.block_count", Value::U32(3))
        .kv("qwen3moe.rope.freq_base", Value::F32(1e6))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(vec![Value::String("a".into()), Value::String("bc".into())]),
        )
        .kv("flag", Value::Bool(true))
        .kv("neg", Value::I64(-5));
    w.tensor("a", &[4, 2], GgmlType::F32, (0..32).collect())
        .tensor("b", &[3], GgmlType::F16, vec![1; 6])
        .tensor("q", &[64, 2], GgmlType::Q8_0, vec![7; 2 * 2 * 34]);
    w
}

/// Where tensor `name`'s offset field (of a tensor with `n_dims` dimensions) is in `bytes`.
fn offset_field(bytes: &[u8], name: &str, n_dims: usize) -> usize {
    let mut info = (name.len() as u64).to_le_bytes().to_vec();
    info.extend(name.as_bytes());
    info.extend((n_dims as u32).to_le_bytes());
    let at = bytes.windows(info.len()).position(|w| w == info).unwrap();
    at + info.len() + 8 * n_dims + 4
}

#[test]
fn a_written_file_reads_back() {
    let dir = tmp("roundtrip");
    let path = dir.join("m.gguf");
    sample().write(&path).unwrap();
    assert!(is_gguf(&path));
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.architecture().unwrap(), "qwen3moe");
    assert_eq!(g.usize("qwen3moe.block_count").unwrap(), 3);
    assert_eq!(g.opt_f64("qwen3moe.rope.freq_base").unwrap(), Some(1e6));
    assert_eq!(g.get("neg").unwrap().as_i64(), Some(-5));
    assert_eq!(g.get("flag").unwrap().as_bool(), Some(true));
    assert_eq!(
        g.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap().len(),
        2
    );
    let err = g.usize("qwen3moe.rope.freq_base").unwrap_err().to_string();
    assert!(err.contains("m.gguf") && err.contains("freq_base"), "{err}");
    let names: Vec<_> = g.tensors.iter().map(|t| (t.name.as_str(), t.len)).collect();
    assert_eq!(names, [("a", 32), ("b", 6), ("q", 136)]);
    let a = &g.tensors[0];
    assert_eq!(a.shape(), [2, 4]);
    assert_eq!(
        read_at(&path, a.offset, 32).unwrap(),
        (0..32).collect::<Vec<u8>>()
    );
    let q = &g.tensors[2];
    assert_eq!(q.offset % 32, 0);
    assert_eq!(read_at(&path, q.offset, 136).unwrap(), vec![7; 136]);
}

#[test]
fn every_truncation_is_an_error_naming_the_file() {
    let dir = tmp("truncated");
    let bytes = sample().to_bytes();
    let path = dir.join("cut.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let last = Gguf::open(&path)
        .unwrap()
        .tensors
        .iter()
        .map(|t| t.offset + t.len)
        .max()
        .unwrap();
    // Every length short of the last tensor's end (the padding after it is not needed).
    for len in 0..last as usize {
        std::fs::write(&path, &bytes[..len]).unwrap();
        match Gguf::open(&path) {
            Ok(_) => panic!("a file cut at {len} of {} bytes opened", bytes.len()),
            Err(e) => assert!(e.to_string().contains("cut.gguf"), "{e}"),
        }
    }
}

#[test]
fn hostile_counts_and_offsets_are_refused() {
    let dir = tmp("hostile");
    let path = dir.join("h.gguf");
    let check = |bytes: &[u8], want: &str| {
        std::fs::write(&path, bytes).unwrap();
        let e = Gguf::open(&path).unwrap_err().to_string();
        assert!(e.contains(want), "expected `{want}` in: {e}");
    };
    let good = sample().to_bytes();
    // A tensor count of 2^60.
    let mut b = good.clone();
    b[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
    check(&b, "tensor count");
    // The first key's length of 2^62.
    let mut b = good.clone();
    b[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes());
    check(&b, "length of key 0");
    // Version 1, a big-endian file, not a GGUF at all.
    let mut b = good.clone();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    check(&b, "version 1");
    let mut b = good.clone();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    check(&b, "big-endian");
    check(b"PK\x03\x04 not a model", "magic");

    // A tensor past the end, one misaligned, two overlapping, an odd block.
    let mut w = sample();
    w.tensors[2].3.truncate(10);
    let mut b = w.to_bytes();
    b.truncate(b.len() - 64);
    check(&b, "past the end");
    let mut w = GgufWriter::default();
    w.tensor("x", &[2], GgmlType::F32, vec![0; 8]);
    let mut b = w.to_bytes();
    let at = offset_field(&b, "x", 1);
    b[at..at + 8].copy_from_slice(&4u64.to_le_bytes());
    check(&b, "not a multiple of the alignment");
    let mut w = GgufWriter::default();
    w.tensor("x", &[16], GgmlType::F32, vec![0; 64])
        .tensor("y", &[2], GgmlType::F32, vec![0; 8]);
    let mut b = w.to_bytes();
    let at = offset_field(&b, "y", 1);
    b[at..at + 8].copy_from_slice(&32u64.to_le_bytes());
    check(&b, "overlap");
    let mut w = GgufWriter::default();
    w.tensor("odd", &[48], GgmlType::Q8_0, vec![0; 34]);
    check(&w.to_bytes(), "innermost dimension is 48");
}

#[test]
fn types_ggml_does_not_define_open_and_name_their_id() {
    let dir = tmp("unknown");
    let path = dir.join("u.gguf");
    let mut w = GgufWriter::default();
    w.tensor("x", &[4], GgmlType(77), vec![0; 4]);
    w.write(&path).unwrap();
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.tensors[0].len, 0);
    assert_eq!(g.tensors[0].ty.name(), "unknown type 77");
    assert_eq!(GgmlType::Q8_0.to_string(), "Q8_0");
}

#[test]
fn a_split_model_opens_from_its_first_file() {
    let dir = tmp("split");
    for i in 1..=3u16 {
        let mut w = GgufWriter::default();
        w.kv("split.no", Value::U16(i - 1))
            .kv("split.count", Value::U16(3));
        if i == 1 {
            w.kv("general.architecture", Value::String("llama".into()));
        }
        w.tensor(&format!("t{i}"), &[2], GgmlType::F32, vec![i as u8; 8]);
        w.write(&dir.join(format!("m-{i:05}-of-00003.gguf"))).unwrap();
    }
    let g = Gguf::open(&dir.join("m-00001-of-00003.gguf")).unwrap();
    assert_eq!(g.paths.len(), 3);
    let files: Vec<_> = g.tensors.iter().map(|t| (t.name.as_str(), t.file)).collect();
    assert_eq!(files, [("t1", 0), ("t2", 1), ("t3", 2)]);
    assert_eq!(read_at(&g.paths[2], g.tensors[2].offset, 8).unwrap(), vec![3; 8]);
    std::fs::remove_file(dir.join("m-00002-of-00003.gguf")).unwrap();
    let e = Gguf::open(&dir.join("m-00001-of-00003.gguf"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("m-00002-of-00003.gguf") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn a_header_is_found_from_prefixes_of_the_file() {
    let bytes = sample().to_bytes();
    let path = Path::new("remote.gguf");
    let total = bytes.len() as u64;
    let first_tensor = {
        let dir = tmp("prefix");
        let p = dir.join("m.gguf");
        std::fs::write(&p, &bytes).unwrap();
        Gguf::open(&p)
            .unwrap()
            .tensors
            .iter()
            .map(|t| t.offset)
            .min()
            .unwrap()
    };
    let mut found = None;
    for len in 0..=bytes.len() {
        match header_end(&bytes[..len], total, path).unwrap() {
            None => assert!(found.is_none(), "a longer prefix than {found:?} asked for more"),
            Some(end) => {
                if found.is_none() {
                    // The first prefix that holds the header: its end, up to the alignment.
                    assert!(len as u64 <= end && end - (len as u64) < 32, "{len} -> {end}");
                }
                assert_eq!(*found.get_or_insert(end), end);
            }
        }
    }
    assert_eq!(
        found,
        Some(first_tensor),
        "the data section starts at the first tensor"
    );
    // A malformed header is an error at once, not a request for more bytes.
    let mut bad = bytes.clone();
    bad[0] = b'X';
    assert!(header_end(&bad[..16], total, path).is_err());
    // A string length beyond the file is refused before anything is allocated for it.
    let mut huge = bytes[..24].to_vec();
    huge.extend((u64::MAX / 2).to_le_bytes());
    let e = header_end(&huge, total, path).unwrap_err().to_string();
    assert!(e.contains("remote.gguf"), "{e}");
}

#[test]
fn split_part_names_parse_and_round_trip() {
    assert_eq!(split_part("M-Q8_0-00002-of-00003.gguf"), Some(("M-Q8_0", 2, 3)));
    assert_eq!(split_part("dir/M-00001-of-00001.gguf"), Some(("dir/M", 1, 1)));
    for name in [
        "M.gguf",
        "M-1-of-3.gguf",
        "M-00001-of-00003.bin",
        "M-0000x-of-00003.gguf",
        "M-00001-of-3.gguf",
    ] {
        assert_eq!(split_part(name), None, "{name}");
    }
    let names = split_part_names("dir/M-BF16", 3);
    assert_eq!(names[2], "dir/M-BF16-00003-of-00003.gguf");
    for (i, n) in names.iter().enumerate() {
        assert_eq!(split_part(n), Some(("dir/M-BF16", i + 1, 3)));
    }
    assert_eq!(split_names(Path::new("/m/M-00002-of-00002.gguf")), None);
    assert_eq!(
        split_names(Path::new("/m/M-00001-of-00002.gguf")).map(|v| v.len()),
        Some(2)
    );
}
