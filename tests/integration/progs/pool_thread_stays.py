"""A module that leaves a thread running through forks (a pool must refuse to serve after it)."""

import threading

threading.Thread(target=threading.Event().wait, daemon=True).start()
