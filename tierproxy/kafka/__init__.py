"""tierproxy's own Kafka clients (a blocking one for tools and the jobs, an asyncio one for the proxy's control
plane) and the TLS contexts of its connections."""
