"""Local stand-ins for the Google Cloud endpoints the fleet calls (Storage is fake-gcs-server)."""
