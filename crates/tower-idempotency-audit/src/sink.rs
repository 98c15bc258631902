//! Append-only files: the journal's file sink and the checkpoint anchor.
//!
//! Each batch of lines is written with one `write_all` and made durable with `sync_data`
//! before the call returns. Opening a file that ends in a torn line (a crash in the middle of
//! a write) cuts that line off, so the next batch starts on a line of its own; a write that
//! failed half-way is cut off the same way before the batch is written again.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::export::{JournalReader, NumberedLine};

/// An append-only file of journal lines, fsynced per batch.
#[derive(Debug)]
pub struct AppendFile {
    path: PathBuf,
    file: File,
    /// The length of the file up to the last batch that reached the disk.
    durable: u64,
    /// A write failed: the file may hold part of a batch past `durable`.
    dirty: bool,
}

impl AppendFile {
    /// Opens (or creates) `path` and returns it with the lines already in it; a torn last
    /// line is cut off the file.
    pub fn open(path: &Path) -> io::Result<(Self, Vec<NumberedLine>)> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        let mut reader = JournalReader::new(BufReader::new(&mut file));
        let mut lines = Vec::new();
        while let Some(next) = reader.next_line() {
            lines.push(next?);
        }
        let keep = reader.complete_bytes();
        if reader.torn() {
            file.set_len(keep)?;
        }
        let mut sink = Self {
            path: path.to_path_buf(),
            file,
            durable: keep,
            dirty: false,
        };
        if keep > 0 && !sink.ends_with_newline(keep)? {
            sink.append("\n")?;
        }
        Ok((sink, lines))
    }

    fn ends_with_newline(&mut self, len: u64) -> io::Result<bool> {
        let mut last = [0u8; 1];
        self.file.seek(SeekFrom::Start(len - 1))?;
        self.file.read_exact(&mut last)?;
        Ok(last[0] == b'\n')
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `text` (whole lines) and waits until it is on disk.
    pub fn append(&mut self, text: &str) -> io::Result<()> {
        if self.dirty {
            self.file.set_len(self.durable)?;
            self.dirty = false;
        }
        let written = self
            .file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.sync_data());
        match written {
            Ok(()) => {
                self.durable += text.len() as u64;
                Ok(())
            }
            Err(err) => {
                self.dirty = true;
                Err(err)
            }
        }
    }
}
