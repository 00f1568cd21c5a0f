"""System helpers: /proc, held kernel files, atomic writes, safe directories, paths,
sd_notify, journald, test pause points, worker threads, run state.

They import only the config room.
"""
