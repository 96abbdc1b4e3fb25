"""A correct solution of stack_calc, hidden from the company: the reference company's code."""


def rpn(expression):
    stack = []
    for token in expression.split():
        if token in ("+", "-", "*", "/"):
            b, a = stack.pop(), stack.pop()
            stack.append(a + b if token == "+" else a - b if token == "-" else a * b if token == "*" else int(a / b))
        else:
            stack.append(int(token))
    return stack[0]
