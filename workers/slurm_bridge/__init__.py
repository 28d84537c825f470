"""The Slurm bridge: runs on a Slurm submit host, holds no database credentials, and talks to the portal over HTTP
with its pool's token (see docs/slurm.md). No Django here."""
