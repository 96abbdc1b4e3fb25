"""A correct solution of json_flatten, hidden from the company: the reference company's code."""


def flatten(data, prefix=""):
    flat = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flatten(value, path))
        else:
            flat[path] = value
    return flat
