//! Pseudo-terminals for `exec` with `tty=true`, with rustix (no unsafe): the master side is
//! read and written without blocking through tokio's pipe types.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::process::Stdio;

use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A pseudo-terminal pair: the master stays here, the slave becomes the child's stdio.
#[derive(Debug)]
pub struct Pty {
    master: OwnedFd,
    slave: OwnedFd,
}

impl Pty {
    /// Allocate one (`posix_openpt`, `grantpt`, `unlockpt`, open the slave).
    ///
    /// # Errors
    /// No pseudo-terminal is available.
    pub fn open() -> io::Result<Self> {
        let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
        rustix::pty::grantpt(&master)?;
        rustix::pty::unlockpt(&master)?;
        let name = rustix::pty::ptsname(&master, Vec::new())?;
        let slave = rustix::fs::open(name.as_c_str(), OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC, Mode::empty())?;
        rustix::io::ioctl_fionbio(&master, true)?;
        Ok(Self { master, slave })
    }

    /// A handle to the slave for one of the child's stdio streams.
    ///
    /// # Errors
    /// The descriptor cannot be duplicated.
    pub fn slave_stdio(&self) -> io::Result<Stdio> {
        Ok(Stdio::from(self.slave.try_clone()?))
    }

    /// Set the terminal size (the child gets SIGWINCH if it is the terminal's foreground).
    ///
    /// # Errors
    /// The ioctl failed.
    pub fn resize(&self, width: u16, height: u16) -> io::Result<()> {
        resize(&self.master, width, height)
    }

    /// Close this side's slave descriptor (once the child has it), so reads see the end when
    /// the child's side closes; returns the master's reading and writing halves.
    ///
    /// # Errors
    /// The master cannot be duplicated or registered with the runtime.
    pub fn into_master(self) -> io::Result<(MasterReader, MasterWriter)> {
        drop(self.slave);
        // tokio's pipe types poll any non-blocking descriptor; a pty master is one.
        let rx = tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(self.master.try_clone()?)?;
        let tx = tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(self.master.try_clone()?)?;
        Ok((MasterReader { rx }, MasterWriter { tx, fd: self.master }))
    }
}

fn resize(fd: impl AsFd, width: u16, height: u16) -> io::Result<()> {
    let size = Winsize { ws_row: height, ws_col: width, ws_xpixel: 0, ws_ypixel: 0 };
    rustix::termios::tcsetwinsize(fd, size).map_err(io::Error::from)
}

/// What the terminal prints.
#[derive(Debug)]
pub struct MasterReader {
    rx: tokio::net::unix::pipe::Receiver,
}

impl MasterReader {
    /// Read what the terminal printed; `Ok(0)` once every slave descriptor is closed.
    ///
    /// # Errors
    /// Reading failed.
    pub async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.rx.read(buf).await {
            // Linux answers EIO once the slave side is closed: that is the end.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) => Ok(0),
            other => other,
        }
    }
}

/// Typing into the terminal, and its size.
#[derive(Debug)]
pub struct MasterWriter {
    tx: tokio::net::unix::pipe::Sender,
    fd: OwnedFd,
}

impl MasterWriter {
    /// Type `data` into the terminal.
    ///
    /// # Errors
    /// Writing failed.
    pub async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.tx.write_all(data).await
    }

    /// Set the terminal size.
    ///
    /// # Errors
    /// The ioctl failed.
    pub fn resize(&self, width: u16, height: u16) -> io::Result<()> {
        resize(&self.fd, width, height)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_child_on_a_pty_sees_its_size() -> anyhow::Result<()> {
        let pty = Pty::open()?;
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", "stty size"]).stdin(pty.slave_stdio()?).stdout(pty.slave_stdio()?).stderr(pty.slave_stdio()?);
        pty.resize(101, 33)?;
        let mut child = cmd.spawn()?;
        drop(cmd);
        let (mut master, _writer) = pty.into_master()?;
        let mut out = Vec::new();
        let mut buf = [0u8; 256];
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            loop {
                let n = master.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
            }
            anyhow::Ok(())
        })
        .await??;
        child.wait().await?;
        assert_eq!(String::from_utf8_lossy(&out).trim(), "33 101");
        Ok(())
    }
}
