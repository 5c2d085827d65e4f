"""Decision tables on disk: reading, writing, meta files, and `ppd table show|plot`."""
