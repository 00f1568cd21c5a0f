"""A module that leaves a thread running when imported (a pool must refuse to fork after it)."""

import threading
import time

threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
