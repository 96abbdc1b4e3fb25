"""A correct solution of balanced_brackets, hidden from the company: the reference company's code."""


def balanced(text):
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for char in text:
        if char in "([{":
            stack.append(char)
        elif char in pairs:
            if not stack or stack.pop() != pairs[char]:
                return False
    return not stack
