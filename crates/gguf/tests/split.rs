//! Split models: the parts `GgufWriter::to_split_bytes` writes (llama.cpp's `gguf-split`
//! layout) open from the first part as the whole file does, and a missing, misplaced or
//! misnamed part is an error that names the file to open.

use std::path::{Path, PathBuf};

use pyramid_gguf::split::split_file_name;
use pyramid_gguf::{GgmlType, GgufError, GgufFile, GgufWriter};

/// The committed tiny Llama 3, a real converter's file with a tokenizer in its metadata.
fn tiny_llama3() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/llama3-rope/tiny-llama3.gguf")
}

/// Writes `writer` split in `n_split` parts under `dir`; returns the parts' paths.
fn write_split(writer: &GgufWriter, dir: &Path, n_split: usize) -> Vec<PathBuf> {
    let parts = writer.to_split_bytes(n_split).unwrap();
    parts
        .into_iter()
        .enumerate()
        .map(|(idx, bytes)| {
            let path = dir.join(split_file_name("tiny", idx, n_split));
            std::fs::write(&path, bytes).unwrap();
            path
        })
        .collect()
}

fn assert_same_model(split: &GgufFile, whole: &GgufFile) {
    let keys = |f: &GgufFile| -> Vec<String> {
        f.metadata()
            .iter()
            .map(|(k, _)| k.to_string())
            .filter(|k| !k.starts_with("split."))
            .collect()
    };
    assert_eq!(keys(split), keys(whole));
    for (key, value) in whole.metadata().iter() {
        assert_eq!(split.metadata().get(key), Some(value), "{key}");
    }
    assert_eq!(split.tensors().len(), whole.tensors().len());
    for info in whole.tensors() {
        let got = split.tensor_info(&info.name).unwrap();
        assert_eq!(
            (&got.dims, got.ggml_type),
            (&info.dims, info.ggml_type),
            "{}",
            info.name
        );
        assert_eq!(
            split.tensor_bytes(got),
            whole.tensor_bytes(info),
            "{}",
            info.name
        );
        assert_eq!(
            split.tensor_f32(&info.name).unwrap(),
            whole.tensor_f32(&info.name).unwrap()
        );
    }
}

#[test]
fn a_split_model_opens_from_its_first_part_as_the_whole_file() {
    let whole = GgufFile::open(tiny_llama3()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let paths = write_split(&GgufWriter::from_file(&whole).unwrap(), dir.path(), 3);

    let split = GgufFile::open(&paths[0]).unwrap();
    assert_same_model(&split, &whole);
    assert_eq!(split.split_paths(), paths.as_slice());
    assert!(whole.split_paths().is_empty());
    // Tensors really come from all three files.
    let mut used: Vec<usize> = split.tensors().iter().map(|t| t.split_idx).collect();
    used.dedup();
    assert_eq!(used, [0, 1, 2]);
    // Only the first part carries the model's metadata.
    let second = std::fs::read(&paths[1]).unwrap();
    let Err(err) = GgufFile::from_bytes(second) else {
        panic!("a lone part opened")
    };
    assert!(err.to_string().contains("first part"), "{err}");
    // Giving back a later part's pages leaves its tensor readable.
    let last = &split.tensors()[split.tensors().len() - 1];
    split.release(&last.name);
    assert_eq!(
        split.tensor_f32(&last.name).unwrap(),
        whole.tensor_f32(&last.name).unwrap()
    );
}

#[test]
fn a_missing_or_misplaced_part_is_named() {
    let mut writer = GgufWriter::new();
    writer
        .add_metadata(
            "general.architecture",
            pyramid_gguf::Value::String("x".into()),
        )
        .unwrap();
    for i in 0..4 {
        writer
            .add_tensor_f32(format!("t{i}"), &[32], GgmlType::F32, &[i as f32; 32])
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let paths = write_split(&writer, dir.path(), 2);

    // The second part opened first: told which file to open.
    let err = GgufFile::open(&paths[1]).unwrap_err().to_string();
    assert!(
        err.contains("open its first part") && err.contains("tiny-00001-of-00002.gguf"),
        "{err}"
    );

    // A part that is gone.
    std::fs::remove_file(&paths[1]).unwrap();
    match GgufFile::open(&paths[0]) {
        Err(GgufError::MissingSplit {
            path,
            split_idx: 2,
            n_split: 2,
        }) => assert_eq!(path, paths[1]),
        other => panic!("expected MissingSplit, got {other:?}"),
    }

    // A first part renamed out of the pattern cannot find the others.
    let renamed = dir.path().join("renamed.gguf");
    std::fs::rename(&paths[0], &renamed).unwrap();
    let err = GgufFile::open(&renamed).unwrap_err().to_string();
    assert!(err.contains("not named like one"), "{err}");

    // Parts of another split in the place of one: refused.
    let four = write_split(&writer, dir.path(), 4);
    std::fs::copy(&four[1], &four[2]).unwrap();
    let err = GgufFile::open(&four[0]).unwrap_err().to_string();
    assert!(err.contains("expected part 3 of 4"), "{err}");
    assert!(writer.to_split_bytes(5).is_err(), "more parts than tensors");
}
