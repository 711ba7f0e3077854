"""The daemon process: sockets, scheduler, runner supervision, sizing."""
