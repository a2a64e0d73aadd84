"""`anatomy bench`: anatomy side by side with the library a user would pick instead (cli.py)."""
