//! Where log lines go: gathered in memory and written out by a thread of their own, in batches.
//!
//! Every served request logs a line. Handing each line to a writer thread through a channel
//! wakes that thread once per line when the proxy is not saturated (the queue runs dry between
//! requests), and the wake-up, the context switch and the `write` cost more than formatting the
//! line: at 1,000 requests a second on one core, about 60 µs of CPU per request, half of the
//! request's whole cost. Here a line is appended to a shared buffer under a lock held for the
//! copy alone (or for writing the line in place, [`BatchedLog::append_with`]). The writer
//! thread is woken by the first line after a quiet spell, then lets lines gather for
//! [`Batching::gather`] before one `write`; a buffer past [`Batching::wake_at`] is written at
//! once. An idle proxy's writer sleeps without a timer.
//!
//! Nothing is lost: past [`Batching::max_pending`] bytes waiting, a logging thread waits for the
//! writer rather than dropping its line. When logging ends ([`FlushOnDrop`]) the writer writes
//! what waits and hands the output back; lines logged after that are written by the threads that
//! log them, after the rest. The end waits at most [`LAST_WRITE_WAIT`] for that: an output that
//! never returns from a write (a pipe nobody reads) must not keep the process from exiting.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// When the writer thread writes.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    /// How long lines gather after the first one of a batch: what a line waits, besides a
    /// write already under way.
    pub gather: Duration,
    /// Bytes waiting that start a write at once, without waiting out `gather`.
    pub wake_at: usize,
    /// Bytes waiting past which a logging thread waits for the writer.
    pub max_pending: usize,
}

impl Default for Batching {
    fn default() -> Self {
        Batching {
            gather: Duration::from_millis(20),
            wake_at: 64 * 1024,
            max_pending: 4 * 1024 * 1024,
        }
    }
}

/// The lines not yet written, and where the writer thread is.
struct Pending {
    lines: Vec<u8>,
    /// The writer sleeps until a first line wakes it.
    writer_idle: bool,
    /// Logging is ending: the writer writes what waits, then stops.
    closing: bool,
    /// The writer has stopped (or never started): lines are written by the threads that log
    /// them, to the same output, after everything the writer wrote.
    direct: bool,
}

type Output = Box<dyn Write + Send>;

struct Shared {
    pending: Mutex<Pending>,
    /// Wakes the writer: a first line, a full buffer, or the end.
    wake: Condvar,
    /// Wakes logging threads waiting for room.
    room: Condvar,
    batching: Batching,
    /// The output, while no writer thread holds it.
    out: Mutex<Option<Output>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A thread that panicked while holding the lock left whole lines behind it (the copy
        // cannot panic halfway through a line): go on with them.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn output(&self) -> MutexGuard<'_, Option<Output>> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The writer handed to the log formatter: cheap to clone, one per logging call.
#[derive(Clone)]
pub struct BatchedLog {
    shared: Arc<Shared>,
}

/// Ends logging when dropped: what is still waiting is written, and the writer thread ends.
pub struct FlushOnDrop {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Starts the writer thread over `out`.
pub fn start<W: Write + Send + 'static>(out: W, batching: Batching) -> (BatchedLog, FlushOnDrop) {
    let shared = Arc::new(Shared {
        pending: Mutex::new(Pending {
            lines: Vec::new(),
            writer_idle: false,
            closing: false,
            direct: false,
        }),
        wake: Condvar::new(),
        room: Condvar::new(),
        batching,
        out: Mutex::new(Some(Box::new(out))),
    });
    let writer = shared.clone();
    let thread = std::thread::Builder::new()
        .name("compactor-log".into())
        .spawn(move || write_batches(&writer))
        .ok();
    if thread.is_none() {
        // No thread for the log: lines are written by the threads that log them.
        shared.lock().direct = true;
    }
    (
        BatchedLog {
            shared: shared.clone(),
        },
        FlushOnDrop { shared, thread },
    )
}

/// The writer thread: sleeps until a line comes, lets more gather, writes them in one piece.
fn write_batches(shared: &Shared) {
    let Some(mut out) = shared.output().take() else {
        return;
    };
    let mut batch = Vec::new();
    loop {
        let mut pending = shared.lock();
        while pending.lines.is_empty() && !pending.closing {
            pending.writer_idle = true;
            pending = shared.wake.wait(pending).unwrap_or_else(|e| e.into_inner());
        }
        pending.writer_idle = false;
        if !pending.closing && pending.lines.len() < shared.batching.wake_at {
            pending = shared
                .wake
                .wait_timeout(pending, shared.batching.gather)
                .map_or_else(|e| e.into_inner().0, |(p, _)| p);
        }
        std::mem::swap(&mut batch, &mut pending.lines);
        if pending.closing && batch.is_empty() {
            // Everything logged so far is written: the output goes back for the lines logged
            // from now on, which their own threads write.
            *shared.output() = Some(out);
            pending.direct = true;
            drop(pending);
            shared.room.notify_all();
            return;
        }
        drop(pending);
        shared.room.notify_all();
        // A log that cannot be written (stderr closed) is not a reason to stop serving.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        batch.clear();
        if batch.capacity() > 4 * shared.batching.wake_at {
            // A burst is over: its buffer is not kept for the quiet that follows.
            batch.shrink_to(shared.batching.wake_at);
        }
    }
}

impl BatchedLog {
    /// Logs the line `write_line` writes, written straight into the lines waiting (without a
    /// buffer of its own and a copy from it). The lock is held while it writes: it must only
    /// append one whole line.
    pub fn append_with(&self, write_line: impl FnOnce(&mut Vec<u8>)) -> std::io::Result<()> {
        let batching = self.shared.batching;
        let mut pending = self.shared.lock();
        while pending.lines.len() >= batching.max_pending && !pending.direct {
            pending = self
                .shared
                .room
                .wait(pending)
                .unwrap_or_else(|e| e.into_inner());
        }
        if pending.direct {
            drop(pending);
            // There in this mode: the writer never started, or gave it back when it stopped.
            let mut line = Vec::new();
            write_line(&mut line);
            if let Some(out) = self.shared.output().as_mut() {
                out.write_all(&line)?;
            }
            return Ok(());
        }
        let before = pending.lines.len();
        write_line(&mut pending.lines);
        let first = std::mem::take(&mut pending.writer_idle);
        let full = before < batching.wake_at && pending.lines.len() >= batching.wake_at;
        drop(pending);
        if first || full {
            self.shared.wake.notify_one();
        }
        Ok(())
    }
}

impl Write for BatchedLog {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        self.append_with(|lines| lines.extend_from_slice(line))?;
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchedLog {
    type Writer = BatchedLog;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// How long the end of logging waits for the last write: a stderr nobody reads (a full pipe)
/// must not keep the process from exiting.
const LAST_WRITE_WAIT: Duration = Duration::from_secs(1);

impl Drop for FlushOnDrop {
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let deadline = std::time::Instant::now() + LAST_WRITE_WAIT;
            while !thread.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            // A writer still busy after that is left to the end of the process.
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A writer that records every `write` it gets, slowly when asked.
    #[derive(Clone, Default)]
    struct Recorder {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        delay: Duration,
    }

    impl Write for Recorder {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            std::thread::sleep(self.delay);
            self.writes.lock().unwrap().push(bytes.to_vec());
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// One line in one `write`, as the log formatter writes each event.
    fn line(log: &mut BatchedLog, text: &str) {
        log.write_all(format!("{text}\n").as_bytes()).unwrap();
    }

    /// Four threads logging `lines` numbered lines each, started now.
    fn log_from_four_threads(log: &BatchedLog, lines: usize) -> Vec<std::thread::JoinHandle<()>> {
        (0..4)
            .map(|t| {
                let mut log = log.clone();
                std::thread::spawn(move || {
                    for i in 0..lines {
                        line(&mut log, &format!("t{t} {i:03}"));
                    }
                })
            })
            .collect()
    }

    /// Every line of [`log_from_four_threads`] is in `text`, each thread's in its order.
    fn assert_each_thread_whole_and_in_order(text: &str, lines: usize) {
        for t in 0..4 {
            let prefix = format!("t{t} ");
            let written: Vec<&str> = text.lines().filter(|l| l.starts_with(&prefix)).collect();
            let expected: Vec<String> = (0..lines).map(|i| format!("t{t} {i:03}")).collect();
            assert_eq!(written, expected, "thread {t}'s lines, in order");
        }
    }

    impl Recorder {
        fn text(&self) -> String {
            String::from_utf8(self.writes.lock().unwrap().concat()).unwrap()
        }
        fn write_count(&self) -> usize {
            self.writes.lock().unwrap().len()
        }
    }

    #[test]
    fn lines_logged_close_together_are_written_in_one_piece_and_in_order() {
        let out = Recorder::default();
        // Long enough that a busy machine cannot split the loop below across two batches.
        let batching = Batching {
            gather: Duration::from_millis(500),
            ..Batching::default()
        };
        let (log, end) = start(out.clone(), batching);
        for i in 0..100 {
            line(&mut log.clone(), &format!("line {i}"));
        }
        // The first line woke the writer, which lets the rest gather before writing.
        let deadline = Instant::now() + Duration::from_secs(5);
        while out.text().lines().count() < 100 {
            assert!(Instant::now() < deadline, "{}", out.text());
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(out.write_count(), 1, "{:?}", out.writes.lock().unwrap());
        drop(end);
        let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(out.text(), expected);
    }

    #[test]
    fn a_line_is_written_within_the_gathering_time_without_more_lines() {
        let out = Recorder::default();
        let batching = Batching {
            gather: Duration::from_millis(10),
            ..Batching::default()
        };
        let (mut log, _end) = start(out.clone(), batching);
        for round in 0..3 {
            line(&mut log, &format!("alone {round}"));
            let deadline = Instant::now() + Duration::from_secs(5);
            while !out.text().contains(&format!("alone {round}")) {
                assert!(Instant::now() < deadline, "line {round} never written");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        assert_eq!(out.write_count(), 3);
    }

    #[test]
    fn a_full_buffer_makes_loggers_wait_and_loses_nothing() {
        // A slow output and a tiny buffer: loggers on four threads outrun the writer.
        let out = Recorder {
            delay: Duration::from_millis(2),
            ..Recorder::default()
        };
        let batching = Batching {
            gather: Duration::from_millis(50),
            wake_at: 64,
            max_pending: 256,
        };
        let (log, end) = start(out.clone(), batching);
        for t in log_from_four_threads(&log, 200) {
            t.join().unwrap();
        }
        drop(end);
        assert_each_thread_whole_and_in_order(&out.text(), 200);
        assert!(out.write_count() > 1);
    }

    #[test]
    fn lines_logged_while_logging_ends_are_all_written_in_order() {
        for _ in 0..20 {
            let out = Recorder::default();
            let batching = Batching {
                gather: Duration::from_millis(1),
                wake_at: 16,
                max_pending: 32,
            };
            let (log, end) = start(out.clone(), batching);
            let threads = log_from_four_threads(&log, 100);
            std::thread::sleep(Duration::from_millis(1));
            drop(end);
            for t in threads {
                t.join().unwrap();
            }
            assert_each_thread_whole_and_in_order(&out.text(), 100);
        }
    }

    /// An output that never returns from `write`, like a pipe nobody reads.
    struct Stuck;

    impl Write for Stuck {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            std::thread::sleep(Duration::from_secs(3600));
            Ok(0)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn an_output_that_never_takes_the_lines_does_not_hold_the_end() {
        let (mut log, end) = start(Stuck, Batching::default());
        line(&mut log, "never written");
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        drop(end);
        let waited = started.elapsed();
        assert!(waited >= LAST_WRITE_WAIT, "{waited:?}");
        assert!(waited < LAST_WRITE_WAIT * 5, "{waited:?}");
    }

    #[test]
    fn what_waits_is_written_when_logging_ends() {
        let out = Recorder::default();
        let batching = Batching {
            gather: Duration::from_secs(60),
            ..Batching::default()
        };
        let (mut log, end) = start(out.clone(), batching);
        line(&mut log, "last words");
        let started = Instant::now();
        drop(end);
        assert_eq!(out.text(), "last words\n");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the end waited out the gathering"
        );
    }
}
