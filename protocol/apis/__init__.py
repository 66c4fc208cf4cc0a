"""One module per API family; each holds the schema declarations of its requests and responses."""
