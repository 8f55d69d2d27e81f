"""What the HTTP doors share: errors, hosts, bodies, auth, access logs, multipart, responses."""
