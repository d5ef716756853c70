"""What the store's operations decide, as sans-I/O steps both faces drive."""
