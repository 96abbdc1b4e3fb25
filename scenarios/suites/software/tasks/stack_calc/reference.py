"""A correct solution of the stack_calc task (hidden from the company): the reference company answers with it."""


def rpn(expression):
    stack = []
    for token in expression.split():
        if token in ("+", "-", "*", "/"):
            b, a = stack.pop(), stack.pop()
            stack.append(a + b if token == "+" else a - b if token == "-" else a * b if token == "*" else int(a / b))
        else:
            stack.append(int(token))
    return stack[0]
